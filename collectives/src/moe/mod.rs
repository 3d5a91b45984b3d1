//! Expert parallelism: the all-to-all of mixture-of-experts layers. [`Moe::layout`] counts a
//! routing (tokens per rank and per expert, which ranks each token goes to); [`Moe::dispatch`]
//! sends every token once to each rank that holds one of its top-k experts, with its expert
//! indices made local there and its weights; [`Moe::combine`] sends the expert outputs back and
//! sums, at each token's rank, the rows of the ranks it went to. Written once: the kernels of
//! `kernels/collectives/moe.cu` (NVRTC and hipRTC) and the host kernels of [`host`] follow the
//! protocol of `spec.md`; every size is fixed when the exchange is set up and every count stays
//! on the device, so a dispatch and a combine can be captured in a graph and replayed.
//!
#![doc = include_str!("spec.md")]

use std::sync::Mutex;

use mscclpp_comm::Communicator;
use mscclpp_hal::{
    Api, BufferSlice, DataType, Error, KernelDef, KernelId, KernelModule, LaunchConfig, Result,
    StreamApi, TypedKernel,
};

pub(crate) mod args;
mod erased;
pub(crate) mod host;
mod relay;

pub use args::MOE_MAX_RANKS;
pub use erased::AnyMoe;

use args::{
    EM_CAST_FP8, EM_MAX_LOCAL, EM_ON, EM_ROUND_SCALE, EM_UE8M0, HALF_RECEIVE, HALF_SEND, MoeArgs,
    MoeLayoutArgs, RowLayout, STATUS_CAPACITY, STATUS_COMBINE_MISSING, STATUS_EXPERT_RANGE,
    STATUS_ROW_SIZE, buffer_bytes, handle_experts, handle_positions, handle_status, handle_words,
};

use crate::agree::agree;
use crate::algorithms::base::{HEADERS, load};
use relay::Buffers;

// The kernels' C++ names, mangled (`mscclpp::moe::layout(mscclpp::MoeLayoutArgs)`, ...): C++
// names so that profilers show `mscclpp::moe::dispatch` (moe.cu says why). The compile test
// finds each as an entry of the module's PTX.
const LAYOUT: KernelId = KernelId("_ZN7mscclpp3moe6layoutENS_13MoeLayoutArgsE");
const DISPATCH: KernelId = KernelId("_ZN7mscclpp3moe8dispatchENS_7MoeArgsE");
const COMBINE: KernelId = KernelId("_ZN7mscclpp3moe7combineENS_7MoeArgsE");

/// The expert-parallel module.
pub static MODULE: KernelModule = KernelModule {
    name: "collectives/moe.cu",
    source: include_str!("../../../kernels/collectives/moe.cu"),
    headers: HEADERS,
    kernels: &[
        KernelDef::new::<MoeLayoutArgs>(LAYOUT.0, host::layout),
        KernelDef::new::<MoeArgs>(DISPATCH.0, host::dispatch),
        KernelDef::new::<MoeArgs>(COMBINE.0, host::combine),
    ],
};

/// Threads per block on GPUs (the dispatch's scan runs over a block: at most 1024).
const THREADS: u32 = 512;
/// Threads per block of the layout kernel on GPUs, and its blocks at most.
const LAYOUT_THREADS: u32 = 256;
const LAYOUT_BLOCKS: u64 = 1024;
/// Blocks per peer of the dispatch and combine grids on GPUs, at most.
const MAX_BLOCKS_PER_PEER: u32 = 16;

/// Blocks per peer of the dispatch and combine grids: `MSCCLPP_MOE_BLOCKS` where set, else as
/// many as keep every block of every rank resident should all `n` ranks share one GPU (`n^2`
/// blocks per peer and SM at most one), up to [`MAX_BLOCKS_PER_PEER`]. A block waits for the
/// peers' blocks, so a grid that could not all be resident at once would hang.
/// A forced count whose grid could not be resident even on a GPU of its own is refused; one
/// that fits alone but not beside the peers' (ranks sharing a GPU) is the user's choice.
fn blocks_per_peer(multiprocessors: u32, n: usize, forced: Option<u32>) -> Result<u32> {
    match forced {
        Some(b)
            if (1..=MAX_BLOCKS_PER_PEER).contains(&b)
                && u64::from(b) * n as u64 <= u64::from(multiprocessors.max(1)) =>
        {
            Ok(b)
        }
        Some(b) => Err(Error::invalid(format!(
            "MSCCLPP_MOE_BLOCKS={b}: expected 1 to {MAX_BLOCKS_PER_PEER} blocks per peer, and at \
             most one block per SM for the grid of {n} ranks ({multiprocessors} SMs)"
        ))),
        None => {
            let n2 = (n * n) as u32;
            Ok((multiprocessors / n2.max(1)).clamp(1, MAX_BLOCKS_PER_PEER))
        }
    }
}

/// What an exchange is set up for: the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    /// Experts in all, spread evenly: rank `r` holds experts `[r E/n, (r + 1) E/n)`.
    pub num_experts: usize,
    /// Experts per token (the width of `topk_idx` and `topk_weights`).
    pub topk: usize,
    /// Tokens a rank dispatches in one call, at most.
    pub max_tokens: usize,
    /// Bytes of a token's row at most: the hidden size times the element size, of the dispatch's
    /// input (bf16, or FP8 bytes) and of the combine's (bf16, f16 or f32).
    pub max_row_bytes: usize,
    /// Bytes of a token's scales at most (FP8 dispatch: 4 per 128 channels); 0 for none.
    pub max_scale_bytes: usize,
}

/// Outputs of [`Moe::layout`] (zeroed by it first).
#[derive(Debug, Clone, Copy)]
pub struct LayoutOut<'a> {
    /// `[nranks]` i32: tokens that go to each rank.
    pub per_rank: &'a BufferSlice,
    /// `[num_experts]` i32: tokens routed to each expert.
    pub per_expert: &'a BufferSlice,
    /// `[tokens, nranks]` u8: 1 where the token goes to the rank.
    pub in_rank: &'a BufferSlice,
    /// `[1]` i32: 0, or 1 where an expert index was outside `-1..num_experts` (ignored).
    pub status: &'a BufferSlice,
}

/// One dispatch of this rank ([`Moe::dispatch`]).
#[derive(Debug, Clone, Copy)]
pub struct Dispatch<'a> {
    /// Tokens of this rank in this call (at most the configured `max_tokens`).
    pub tokens: usize,
    /// `[tokens, row_bytes]`: the tokens' rows, sent as bytes.
    pub x: &'a BufferSlice,
    pub row_bytes: usize,
    /// `[tokens, topk]` i64: each token's experts (-1: none).
    pub topk_idx: &'a BufferSlice,
    /// `[tokens, topk]` f32, or none.
    pub topk_weights: Option<&'a BufferSlice>,
    /// `[tokens, scale_bytes]` and `scale_bytes`, or none.
    pub scales: Option<(&'a BufferSlice, usize)>,
    /// Rows the outputs hold (the worst case is `nranks * max_tokens`).
    pub capacity: usize,
    /// `[capacity, row_bytes]`: the rows received, sources in rank order, each source's in its
    /// token order.
    pub out_x: &'a BufferSlice,
    /// `[capacity, topk]` i64: the experts of each row made local here (-1: not here).
    pub out_idx: &'a BufferSlice,
    /// `[capacity, topk]` f32: the weights (0 where the expert is not here); needs `topk_weights`.
    pub out_weights: Option<&'a BufferSlice>,
    /// `[capacity, scale_bytes]`; needs `scales`.
    pub out_scales: Option<&'a BufferSlice>,
    /// `[capacity]` i32: each row's token index at its source.
    pub out_src: &'a BufferSlice,
    /// [`Moe::handle_bytes`]: the counts and positions the combine needs.
    pub handle: &'a BufferSlice,
}

impl<'a> Dispatch<'a> {
    /// A dispatch of the expert-major form ([`Moe::dispatch_with`] with an [`ExpertMajor`], which
    /// holds its outputs): no flat outputs (capacity 0, each of them `none`, an empty slice) and
    /// no weights (the combine takes them).
    pub fn expert_major(
        tokens: usize,
        x: &'a BufferSlice,
        row_bytes: usize,
        topk_idx: &'a BufferSlice,
        scales: Option<(&'a BufferSlice, usize)>,
        handle: &'a BufferSlice,
        none: &'a BufferSlice,
    ) -> Self {
        Dispatch {
            tokens,
            x,
            row_bytes,
            topk_idx,
            topk_weights: None,
            scales,
            capacity: 0,
            out_x: none,
            out_idx: none,
            out_weights: None,
            out_scales: None,
            out_src: none,
            handle,
        }
    }
}

/// One combine of this rank ([`Moe::combine`]): the reverse of a dispatch, whose handle it takes.
#[derive(Debug, Clone, Copy)]
pub struct Combine<'a> {
    /// This rank's tokens in the dispatch.
    pub tokens: usize,
    /// `[rows, hidden]` of `dtype`: the received rows, in the dispatch's order.
    pub x: &'a BufferSlice,
    pub rows: usize,
    pub dtype: DataType,
    pub hidden: usize,
    /// `[rows, topk]` f32 sent back with the rows and summed, or none.
    pub topk_weights: Option<&'a BufferSlice>,
    /// The dispatch's handle.
    pub handle: &'a BufferSlice,
    /// `[tokens, hidden]` of `dtype`: each token, the sum of its rows (f32, rounded once).
    pub out_x: &'a BufferSlice,
    /// `[tokens, topk]` f32: the weights summed; needs `topk_weights`.
    pub out_weights: Option<&'a BufferSlice>,
}

/// The counts a dispatch left in its handle ([`Moe::read_handle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Rows from each source rank.
    pub per_source: Vec<usize>,
    /// Rows (token-expert pairs) for each local expert.
    pub per_expert: Vec<usize>,
}

impl Received {
    /// All rows received.
    pub fn rows(&self) -> usize {
        self.per_source.iter().sum()
    }
}

/// Which halves of a call a launch runs. A call is sent, then received: in one launch
/// ([`Halves::Both`]), or in two ([`Halves::Send`], then [`Halves::Receive`] later on the same
/// rank, before its next call of the same kind): DeepEP's receive hook, which lets a rank compute
/// between the two.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Halves {
    #[default]
    Both,
    Send,
    Receive,
}

impl Halves {
    fn bits(self) -> u32 {
        match self {
            Halves::Both => HALF_SEND | HALF_RECEIVE,
            Halves::Send => HALF_SEND,
            Halves::Receive => HALF_RECEIVE,
        }
    }
}

/// Where the expert-major form of a dispatch puts the scales: f32 per 128-channel block, or
/// DeepEP's packed UE8M0 (four blocks' exponents an i32); element `(expert, slot, block)` at
/// `expert * strides[0] + slot * strides[1] + block * strides[2]` (in 4-byte elements).
#[derive(Debug, Clone, Copy)]
pub struct ExpertScales<'a> {
    pub buf: &'a BufferSlice,
    pub strides: [u64; 3],
    pub ue8m0: bool,
}

/// The expert-major ("low-latency") outputs of a dispatch: what DeepEP's `low_latency_dispatch`
/// returns. Each received (row, top-k entry) with a local expert takes that expert's next slot,
/// sources in rank order and each source's rows in token order.
#[derive(Debug, Clone, Copy)]
pub struct ExpertMajor<'a> {
    /// Slots per local expert (DeepEP: ranks times the most tokens a rank dispatches).
    pub capacity: usize,
    /// `[local, capacity, row_bytes]`: the rows.
    pub x: &'a BufferSlice,
    /// The rows' scales (needs the dispatch's `scales`).
    pub scales: Option<ExpertScales<'a>>,
    /// `[local, capacity]` i32: each slot's token at its source.
    pub src: &'a BufferSlice,
    /// `[local, nranks]` i64: per expert and source, `begin << 32 | count`.
    pub range: &'a BufferSlice,
    /// `[local]` i32: the entries each expert received (zeroed first).
    pub count: &'a BufferSlice,
    /// `[local]` i32 the counts are added to, or none.
    pub stats: Option<&'a BufferSlice>,
    /// `[nranks * max_tokens, topk]` i32 ([`Moe::slots_bytes`]): each entry's slot, which the
    /// expert-major combine reads.
    pub slots: &'a BufferSlice,
    /// The send half casts the dispatch's bf16 `x` to E4M3 (DeepEP's `use_fp8`): `row_bytes` is
    /// then the channels (a multiple of 128), `x` holds two bytes each, and the rows carry an f32
    /// scale per 128 channels (no `scales` given).
    pub cast: Option<Fp8Cast>,
}

/// The send half's FP8 cast: per 128 channels, the largest magnitude (at least 1e-4) over 448 is
/// the scale, each channel divided by it and rounded to E4M3; with `round_scale` the scale is the
/// next power of two up (DeepEP's `round_scale`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Cast {
    pub round_scale: bool,
}

/// The expert-major ("low-latency") input of a combine: its `x` is `[local, capacity, hidden]`
/// (the experts' outputs at the dispatch's slots); each token's rows are weighted by its top-k
/// weights where its experts ran and summed.
#[derive(Debug, Clone, Copy)]
pub struct ExpertMajorIn<'a> {
    /// The dispatch's slots per expert.
    pub capacity: usize,
    /// The dispatch's [`ExpertMajor::slots`].
    pub slots: &'a BufferSlice,
    /// `[tokens, topk]` f32: this rank's tokens' weights.
    pub topk_weights: &'a BufferSlice,
}

/// An expert-parallel exchange of a communicator's ranks (one host or several). Dropping it while
/// one of its calls still runs on a stream is the caller's error, as for any buffer of a call.
#[derive(Debug)]
pub struct Moe<A: Api> {
    cfg: MoeConfig,
    rows: RowLayout,
    row_bytes: u64,
    rank: usize,
    nranks: usize,
    host: bool,
    /// Blocks per peer of the GPU grids (fixed for the buffer's life: its counters count them).
    blocks: u32,
    buffer: Buffers,
    layout: TypedKernel<MoeLayoutArgs, A>,
    dispatch: TypedKernel<MoeArgs, A>,
    combine: TypedKernel<MoeArgs, A>,
    /// This rank's calls in flight (a rank's calls are ordered): what a call may follow.
    calls: Mutex<Calls>,
}

/// The order a rank's calls must keep ([`Moe::dispatch_with`], [`Moe::combine_with`]): a send
/// half is followed by its receive half before the next call that writes into the peers'
/// buffers; an expert-major combine reads the rows of the last dispatch at each peer, so it takes
/// that dispatch's handle, and no dispatch may rewrite those rows until its receive half.
#[derive(Debug, Default)]
struct Calls {
    /// The handle of a dispatch whose receive half is still to be launched.
    dispatch_pending: Option<u64>,
    /// An expert-major combine's receive half is still to be launched (its peers may still
    /// read the rows of the last dispatch).
    combine_pending: bool,
    /// The handle of the last dispatch sent.
    last_dispatch: Option<u64>,
}

/// Refuses `s` when it holds fewer bytes than the product of `factors` (or the product does
/// not fit 64 bits).
fn need(what: &str, s: &BufferSlice, factors: &[u64]) -> Result<()> {
    let bytes = factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| Error::invalid(format!("{what}: {factors:?} bytes overflow 64 bits")))?;
    if (s.len() as u64) < bytes {
        return Err(Error::invalid(format!(
            "{what}: a buffer of {} bytes where {bytes} are needed",
            s.len()
        )));
    }
    Ok(())
}

impl<A: Api> Moe<A> {
    /// Sets up the exchange: allocates and maps every rank's buffer (a collective call; every
    /// rank passes the same `cfg`).
    pub fn new(comm: &Communicator, cfg: MoeConfig) -> Result<Moe<A>> {
        let (rank, n) = (comm.rank(), comm.nranks());
        if !(2..=MOE_MAX_RANKS).contains(&n) {
            return Err(Error::invalid(format!(
                "an expert-parallel exchange of {n} ranks: 2 to {MOE_MAX_RANKS} ranks are served"
            )));
        }
        if cfg.num_experts == 0 || cfg.num_experts % n != 0 {
            return Err(Error::invalid(format!(
                "{} experts over {n} ranks: every rank must hold the same number of experts",
                cfg.num_experts
            )));
        }
        if cfg.num_experts > i32::MAX as usize
            || cfg.topk == 0
            || cfg.topk > 1024
            || cfg.max_tokens == 0
            || cfg.max_tokens > i32::MAX as usize
            || cfg.max_row_bytes == 0
            || cfg.max_row_bytes > 1 << 40
            || cfg.max_scale_bytes > 1 << 40
        {
            return Err(Error::invalid(format!(
                "expert-parallel settings {cfg:?}: top-k 1..=1024, positive tokens and row bytes (row and scale bytes at most 2^40) needed"
            )));
        }
        agree(comm, "expert-parallel settings", format!("{cfg:?}"))?;
        let rows = RowLayout {
            payload_cap: (cfg.max_row_bytes as u64).div_ceil(16) * 16,
            scale_cap: (cfg.max_scale_bytes as u64).div_ceil(16) * 16,
            topk: cfg.topk as u64,
        };
        let row_bytes = rows.row_bytes();
        let bytes = buffer_bytes(row_bytes, cfg.max_tokens as u64, n as u64).ok_or_else(|| {
            Error::invalid(format!(
                "expert-parallel settings {cfg:?}: the exchange buffer's size overflows 64 bits"
            ))
        })?;
        let buffer = Buffers::exchange(
            comm,
            bytes,
            relay::Shape {
                row_bytes,
                max_tokens: cfg.max_tokens as u64,
                nranks: n as u64,
            },
        )?;
        let info = comm.device().info();
        let host = info.warp_size == 1;
        let blocks = blocks_per_peer(
            info.multiprocessors,
            n,
            mscclpp_hal::env::parse("MSCCLPP_MOE_BLOCKS", "blocks per peer")?,
        )?;
        Ok(Moe {
            cfg,
            rows,
            row_bytes,
            rank,
            nranks: n,
            host,
            blocks,
            buffer,
            layout: load(comm, &MODULE, LAYOUT)?,
            dispatch: load(comm, &MODULE, DISPATCH)?,
            combine: load(comm, &MODULE, COMBINE)?,
            calls: Mutex::new(Calls::default()),
        })
    }

    /// The settings.
    pub fn config(&self) -> &MoeConfig {
        &self.cfg
    }

    /// Experts held by each rank.
    pub fn local_experts(&self) -> usize {
        self.cfg.num_experts / self.nranks
    }

    /// Where a dispatch's handle holds its positions (`[max_tokens, nranks]` i32: the row of
    /// each token at each rank it went to, -1 where it did not), in bytes.
    pub fn handle_positions_at(&self) -> usize {
        4 * handle_positions(self.nranks as u64, self.local_experts() as u64) as usize
    }

    /// Bytes of a dispatch's handle.
    pub fn handle_bytes(&self) -> usize {
        4 * handle_words(
            self.nranks as u64,
            self.local_experts() as u64,
            self.cfg.max_tokens as u64,
        ) as usize
    }

    /// Bytes of the expert-major form's slot table ([`ExpertMajor::slots`]).
    pub fn slots_bytes(&self) -> usize {
        4 * self.nranks * self.cfg.max_tokens * self.cfg.topk
    }

    /// Whether the expert-major form ([`ExpertMajor`]) runs on this exchange, or why not.
    pub fn expert_major(&self) -> Result<()> {
        self.check_expert_major("the expert-major form")
    }

    /// Refuses the expert-major form where it cannot run: experts past what the GPU kernel
    /// counts, or peers on other hosts (their relay carries the flat form's steps only).
    fn check_expert_major(&self, what: &str) -> Result<()> {
        if self.local_experts() > EM_MAX_LOCAL {
            return Err(Error::invalid(format!(
                "{what}: {} experts a rank; the expert-major form serves at most {EM_MAX_LOCAL}",
                self.local_experts()
            )));
        }
        if self.buffer.spans_hosts() {
            return Err(Error::invalid(format!(
                "{what}: the expert-major form runs between ranks of one host; this exchange spans hosts (use the flat form)"
            )));
        }
        Ok(())
    }

    fn check_tokens(&self, tokens: usize) -> Result<()> {
        if tokens > self.cfg.max_tokens {
            return Err(Error::invalid(format!(
                "{tokens} tokens in one call; the exchange was set up for {} at most",
                self.cfg.max_tokens
            )));
        }
        Ok(())
    }

    /// Counts the routing `topk_idx` (`[tokens, topk]` i64) into `out`.
    ///
    /// # Safety
    /// The buffers must stay allocated until the stream has passed the call.
    pub unsafe fn layout(
        &self,
        topk_idx: &BufferSlice,
        tokens: usize,
        out: &LayoutOut,
        stream: &A::Stream,
    ) -> Result<()> {
        let (t, k, n, e) = (
            tokens as u64,
            self.cfg.topk as u64,
            self.nranks as u64,
            self.cfg.num_experts as u64,
        );
        need("the layout's topk_idx", topk_idx, &[8, t, k])?;
        need("the layout's per-rank counts", out.per_rank, &[4, n])?;
        need("the layout's per-expert counts", out.per_expert, &[4, e])?;
        need("the layout's token-in-rank table", out.in_rank, &[t, n])?;
        need("the layout's status", out.status, &[4])?;
        for s in [out.per_rank, out.per_expert, out.in_rank, out.status] {
            stream.fill(s, 0)?;
        }
        if tokens == 0 {
            return Ok(());
        }
        let args = MoeLayoutArgs {
            topk_idx: topk_idx.ptr().0,
            tokens: t,
            per_rank: out.per_rank.ptr().0,
            per_expert: out.per_expert.ptr().0,
            in_rank: out.in_rank.ptr().0,
            status: out.status.ptr().0,
            topk: k as u32,
            num_experts: e as u32,
            nranks: n as u32,
            _pad: 0,
        };
        let cfg = if self.host {
            LaunchConfig::linear(1, 1)
        } else {
            let blocks = t.div_ceil(u64::from(LAYOUT_THREADS)).min(LAYOUT_BLOCKS) as u32;
            LaunchConfig::linear(blocks, LAYOUT_THREADS)
        };
        // SAFETY: the buffers hold what the kernel reads and writes (checked above); the caller
        // keeps them alive until the stream passes the call.
        unsafe { self.layout.launch(stream, cfg, &args) }
    }

    fn base_args(&self) -> MoeArgs {
        MoeArgs {
            buffer: self.buffer.addrs[self.rank],
            peer_buffer: self.buffer.addrs,
            peer_dispatch: self.buffer.dispatch_at,
            peer_combine: self.buffer.combine_at,
            max_tokens: self.cfg.max_tokens as u64,
            row_bytes: self.row_bytes,
            scales_at: self.rows.scales_at(),
            meta_at: self.rows.meta_at(),
            tokens: 0,
            payload_bytes: 0,
            scale_bytes: 0,
            x: 0,
            topk_idx: 0,
            topk_weights: 0,
            scales: 0,
            out_x: 0,
            out_idx: 0,
            out_weights: 0,
            out_scales: 0,
            out_src: 0,
            out_capacity: 0,
            handle: 0,
            topk: self.cfg.topk as u32,
            num_experts: self.cfg.num_experts as u32,
            rank: self.rank as u32,
            nranks: self.nranks as u32,
            dtype: 0,
            phases: HALF_SEND | HALF_RECEIVE,
            abort: mscclpp_hal::dev::current_abort(),
            em_x: 0,
            em_scales: 0,
            em_scale_strides: [0; 3],
            em_src: 0,
            em_range: 0,
            em_count: 0,
            em_slots: 0,
            em_stats: 0,
            em_weights: 0,
            em_capacity: 0,
            em_flags: 0,
            _pad: 0,
        }
    }

    fn grid(&self) -> LaunchConfig {
        if self.host {
            LaunchConfig::linear(self.nranks as u32, 1)
        } else {
            LaunchConfig::linear(self.nranks as u32 * self.blocks, THREADS)
        }
    }

    /// Sends this rank's tokens to the ranks of their experts and receives theirs (a collective
    /// call: every rank dispatches, with its own tokens, as often as the others).
    ///
    /// # Safety
    /// The buffers must stay allocated until the stream has passed the call.
    pub unsafe fn dispatch(&self, d: &Dispatch, stream: &A::Stream) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.dispatch_with(d, Halves::Both, None, stream) }
    }

    /// [`Moe::dispatch`], one half of it or both, and with the expert-major outputs where
    /// `em` (the flat outputs then hold no rows: `capacity` 0).
    ///
    /// # Safety
    /// As [`Moe::dispatch`]; a receive half's buffers are those its send half was given.
    pub unsafe fn dispatch_with(
        &self,
        d: &Dispatch,
        halves: Halves,
        em: Option<&ExpertMajor>,
        stream: &A::Stream,
    ) -> Result<()> {
        self.check_tokens(d.tokens)?;
        // No dispatch receives more than every rank's tokens: a larger capacity is that.
        let most = (self.nranks * self.cfg.max_tokens) as u64;
        let (t, k, cap) = (
            d.tokens as u64,
            self.cfg.topk as u64,
            (d.capacity as u64).min(most),
        );
        let row = d.row_bytes as u64;
        if row == 0 || row > self.rows.payload_cap {
            return Err(Error::invalid(format!(
                "rows of {row} bytes; the exchange was set up for 1 to {} bytes (max_row_bytes {} rounded up to 16)",
                self.rows.payload_cap, self.cfg.max_row_bytes
            )));
        }
        need("the dispatch's x", d.x, &[t, row])?;
        need("the dispatch's topk_idx", d.topk_idx, &[8, t, k])?;
        if let Some(w) = d.topk_weights {
            need("the dispatch's topk_weights", w, &[4, t, k])?;
        }
        let scale_bytes = match d.scales {
            Some((s, b)) => {
                if b as u64 > self.rows.scale_cap || b == 0 {
                    return Err(Error::invalid(format!(
                        "scales of {b} bytes a token; the exchange was set up for 1 to {} (max_scale_bytes {} rounded up to 16)",
                        self.rows.scale_cap, self.cfg.max_scale_bytes
                    )));
                }
                need("the dispatch's scales", s, &[t, b as u64])?;
                b as u64
            }
            None => 0,
        };
        // The send half's cast: x holds bf16 channels, the rows carry E4M3 and a scale per 128.
        let cast = em.and_then(|e| e.cast);
        let scale_bytes = match cast {
            None => scale_bytes,
            Some(_) => {
                let sb = row / 128 * 4;
                if d.scales.is_some() || row % 128 != 0 || sb > self.rows.scale_cap {
                    return Err(Error::invalid(format!(
                        "an FP8 cast of {row} channels: a multiple of 128, no scales given (the cast makes them), at most {} scale bytes a token (max_scale_bytes rounded up to 16)",
                        self.rows.scale_cap
                    )));
                }
                need("the dispatch's bf16 x", d.x, &[t, 2 * row])?;
                sb
            }
        };
        need("the dispatch's out_x", d.out_x, &[cap, row])?;
        need("the dispatch's out_idx", d.out_idx, &[8, cap, k])?;
        need("the dispatch's out_src", d.out_src, &[4, cap])?;
        match (d.topk_weights, d.out_weights) {
            (_, None) => {}
            (Some(_), Some(w)) => need("the dispatch's out_weights", w, &[4, cap, k])?,
            (None, Some(_)) => {
                return Err(Error::invalid(
                    "the dispatch asks for received weights but sends none (topk_weights)",
                ));
            }
        }
        match (d.scales, d.out_scales) {
            (_, None) => {}
            (Some(_), Some(s)) => need("the dispatch's out_scales", s, &[cap, scale_bytes])?,
            (None, Some(_)) => {
                return Err(Error::invalid(
                    "the dispatch asks for received scales but sends none (scales)",
                ));
            }
        }
        need(
            "the dispatch's handle",
            d.handle,
            &[self.handle_bytes() as u64],
        )?;
        let ptr = |s: Option<&BufferSlice>| s.map_or(0, |s| s.ptr().0);
        let em_args = match em {
            None => None,
            Some(e) => Some(self.expert_major_args(e, d, cap, scale_bytes)?),
        };
        // Counts, status and per-expert counts start at 0 (the kernel adds to them); the send
        // half writes the token count, so a receive half alone leaves them.
        if halves != Halves::Receive {
            let zeroed = 4 * handle_positions(self.nranks as u64, self.local_experts() as u64);
            stream.fill(&d.handle.slice(..zeroed as usize)?, 0)?;
        }
        if halves != Halves::Send
            && let Some(e) = em
        {
            stream.fill(e.count, 0)?;
        }
        let base = em_args.unwrap_or_else(|| self.base_args());
        let args = MoeArgs {
            tokens: t,
            payload_bytes: row,
            scale_bytes,
            x: d.x.ptr().0,
            topk_idx: d.topk_idx.ptr().0,
            topk_weights: ptr(d.topk_weights),
            scales: ptr(d.scales.map(|s| s.0)),
            out_x: d.out_x.ptr().0,
            out_idx: d.out_idx.ptr().0,
            out_weights: ptr(d.out_weights),
            out_scales: ptr(d.out_scales),
            out_src: d.out_src.ptr().0,
            out_capacity: cap,
            handle: d.handle.ptr().0,
            phases: halves.bits(),
            ..base
        };
        let handle = d.handle.ptr().0;
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        match (halves, calls.dispatch_pending) {
            (Halves::Receive, Some(h)) if h == handle => {}
            (Halves::Receive, _) => {
                return Err(Error::invalid(
                    "a dispatch's receive half without its send half (the last dispatch sent had another handle, or none is waiting)",
                ));
            }
            (_, Some(_)) => {
                return Err(Error::invalid(
                    "a dispatch while the previous one's receive half is still to be launched",
                ));
            }
            (_, None) if calls.combine_pending => {
                return Err(Error::invalid(
                    "a dispatch while an expert-major combine's receive half is still to be launched (its peers may still read this rank's rows)",
                ));
            }
            _ => {}
        }
        // Everything checked: last, whether the relay to other hosts still runs.
        self.buffer.check()?;
        // SAFETY: every buffer holds what the kernel touches (checked above); the exchange
        // buffer and the peers' mappings live in `self`.
        unsafe { self.dispatch.launch(stream, self.grid(), &args)? };
        match halves {
            Halves::Send => calls.dispatch_pending = Some(handle),
            Halves::Receive => calls.dispatch_pending = None,
            Halves::Both => {}
        }
        if halves != Halves::Receive {
            calls.last_dispatch = Some(handle);
        }
        Ok(())
    }

    /// Sends the received rows back and sums each token's rows (a collective call, after the
    /// dispatch whose handle it takes).
    ///
    /// # Safety
    /// The buffers must stay allocated until the stream has passed the call.
    pub unsafe fn combine(&self, c: &Combine, stream: &A::Stream) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.combine_with(c, Halves::Both, None, stream) }
    }

    /// [`Moe::combine`], one half of it or both, and of the expert-major form where `em`
    /// (`x` then holds `[local, capacity, hidden]` and `rows` is `local * capacity`; no weights
    /// are sent back).
    ///
    /// # Safety
    /// As [`Moe::combine`]; a receive half's buffers are those its send half was given.
    pub unsafe fn combine_with(
        &self,
        c: &Combine,
        halves: Halves,
        em: Option<&ExpertMajorIn>,
        stream: &A::Stream,
    ) -> Result<()> {
        self.check_tokens(c.tokens)?;
        if !matches!(c.dtype, DataType::F32 | DataType::F16 | DataType::BF16) {
            return Err(Error::invalid(format!(
                "a combine of {}: f32, f16 and bf16 rows are summed",
                c.dtype
            )));
        }
        let row = (c.hidden * c.dtype.size()) as u64;
        if row == 0 || row > self.rows.payload_cap {
            return Err(Error::invalid(format!(
                "combine rows of {row} bytes ({} x {}); the exchange was set up for 1 to {} bytes (max_row_bytes rounded up to 16)",
                c.hidden, c.dtype, self.rows.payload_cap
            )));
        }
        let (t, k, rows) = (c.tokens as u64, self.cfg.topk as u64, c.rows as u64);
        need("the combine's x", c.x, &[rows, row])?;
        need("the combine's out_x", c.out_x, &[t, row])?;
        need(
            "the combine's handle",
            c.handle,
            &[self.handle_bytes() as u64],
        )?;
        match (c.topk_weights, c.out_weights) {
            (Some(w), o) => {
                need("the combine's topk_weights", w, &[4, rows, k])?;
                if let Some(o) = o {
                    need("the combine's out_weights", o, &[4, t, k])?;
                }
            }
            (None, None) => {}
            (None, Some(_)) => {
                return Err(Error::invalid(
                    "the combine asks for summed weights but sends none (topk_weights)",
                ));
            }
        }
        let ptr = |s: Option<&BufferSlice>| s.map_or(0, |s| s.ptr().0);
        let mut args = MoeArgs {
            tokens: t,
            payload_bytes: row,
            x: c.x.ptr().0,
            topk_weights: ptr(c.topk_weights),
            out_x: c.out_x.ptr().0,
            out_weights: ptr(c.out_weights),
            out_capacity: rows,
            handle: c.handle.ptr().0,
            dtype: c.dtype as u32,
            phases: halves.bits(),
            ..self.base_args()
        };
        if let Some(e) = em {
            self.check_expert_major("an expert-major combine")?;
            let (local, cap) = (self.local_experts() as u64, e.capacity as u64);
            if c.topk_weights.is_some() || c.out_weights.is_some() {
                return Err(Error::invalid(
                    "an expert-major combine weighs the rows by its topk_weights and sends no weights back",
                ));
            }
            if cap == 0 || rows != local * cap {
                return Err(Error::invalid(format!(
                    "an expert-major combine of {rows} rows: x holds [local experts {local}, capacity {cap}] rows"
                )));
            }
            need("the combine's topk_weights", e.topk_weights, &[4, t, k])?;
            need(
                "the combine's slot table",
                e.slots,
                &[self.slots_bytes() as u64],
            )?;
            args.em_flags = EM_ON;
            args.em_capacity = cap;
            args.em_slots = e.slots.ptr().0;
            args.em_weights = e.topk_weights.ptr().0;
            // The rows sent back are one per received token: as many as the slot table's.
            args.out_capacity = (self.nranks * self.cfg.max_tokens) as u64;
        }
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if calls.dispatch_pending.is_some() {
            return Err(Error::invalid(
                "a combine while a dispatch's receive half is still to be launched",
            ));
        }
        match (halves, calls.combine_pending) {
            (Halves::Receive, true) | (Halves::Send | Halves::Both, false) => {}
            (Halves::Receive, false) => {
                return Err(Error::invalid(
                    "a combine's receive half without an expert-major send half waiting",
                ));
            }
            (_, true) => {
                return Err(Error::invalid(
                    "a combine while the previous one's receive half is still to be launched",
                ));
            }
        }
        if em.is_some()
            && halves != Halves::Receive
            && calls.last_dispatch != Some(c.handle.ptr().0)
        {
            return Err(Error::invalid(
                "an expert-major combine reads the rows of the last dispatch at each rank: it takes that dispatch's handle (another dispatch ran since, or none)",
            ));
        }
        self.buffer.check()?;
        // SAFETY: as in `dispatch`.
        unsafe { self.combine.launch(stream, self.grid(), &args)? };
        match halves {
            Halves::Send => calls.combine_pending = true,
            Halves::Receive => calls.combine_pending = false,
            Halves::Both => {}
        }
        Ok(())
    }

    /// The expert-major part of a dispatch's arguments, its buffers checked.
    fn expert_major_args(
        &self,
        e: &ExpertMajor,
        d: &Dispatch,
        flat_capacity: u64,
        scale_bytes: u64,
    ) -> Result<MoeArgs> {
        self.check_expert_major("an expert-major dispatch")?;
        if flat_capacity != 0 || d.out_weights.is_some() || d.out_scales.is_some() {
            return Err(Error::invalid(
                "an expert-major dispatch writes the expert-major outputs only: the flat outputs (capacity, out_weights, out_scales) must be empty",
            ));
        }
        let (local, n, cap) = (
            self.local_experts() as u64,
            self.nranks as u64,
            e.capacity as u64,
        );
        if cap == 0 || cap > i32::MAX as u64 {
            return Err(Error::invalid(format!(
                "an expert-major dispatch of {cap} slots an expert: 1 to 2^31 - 1"
            )));
        }
        let row = d.row_bytes as u64;
        need("the expert-major x", e.x, &[local, cap, row])?;
        need("the expert-major src", e.src, &[4, local, cap])?;
        need("the expert-major range", e.range, &[8, local, n])?;
        need("the expert-major count", e.count, &[4, local])?;
        if let Some(s) = e.stats {
            need("the expert-major stats", s, &[4, local])?;
        }
        need(
            "the expert-major slot table",
            e.slots,
            &[self.slots_bytes() as u64],
        )?;
        let mut args = self.base_args();
        args.em_flags = EM_ON;
        if let Some(c) = e.cast {
            args.em_flags |= EM_CAST_FP8;
            if c.round_scale {
                args.em_flags |= EM_ROUND_SCALE;
            }
        }
        if let Some(sc) = e.scales {
            if (d.scales.is_none() && e.cast.is_none()) || scale_bytes % 4 != 0 {
                return Err(Error::invalid(format!(
                    "expert-major scales need the dispatch's scales, f32 each ({scale_bytes} bytes a token)"
                )));
            }
            let blocks = scale_bytes / 4;
            if sc.ue8m0 && e.cast.is_some_and(|c| !c.round_scale) {
                return Err(Error::invalid(
                    "packed UE8M0 scales keep each scale's exponent: the cast's scales must be powers of two (round_scale)",
                ));
            }
            if sc.ue8m0 && blocks % 4 != 0 {
                return Err(Error::invalid(format!(
                    "packed UE8M0 scales hold four blocks an int32: {blocks} blocks a token are not"
                )));
            }
            let last = if sc.ue8m0 { blocks / 4 } else { blocks };
            // The furthest element the strides reach, plus one, in 4-byte elements.
            let reach = [local, cap, last]
                .iter()
                .zip(sc.strides)
                .try_fold(1u64, |acc, (&count, stride)| {
                    (count - 1).checked_mul(stride)?.checked_add(acc)
                })
                .ok_or_else(|| Error::invalid("expert-major scale strides overflow 64 bits"))?;
            need("the expert-major scales", sc.buf, &[4, reach])?;
            args.em_scales = sc.buf.ptr().0;
            args.em_scale_strides = sc.strides;
            if sc.ue8m0 {
                args.em_flags |= EM_UE8M0;
            }
        }
        args.em_x = e.x.ptr().0;
        args.em_src = e.src.ptr().0;
        args.em_range = e.range.ptr().0;
        args.em_count = e.count.ptr().0;
        args.em_stats = e.stats.map_or(0, |s| s.ptr().0);
        args.em_slots = e.slots.ptr().0;
        args.em_capacity = cap;
        Ok(args)
    }

    /// Reads a dispatch's counts from its handle (waits for the stream): an error naming what
    /// went wrong where the dispatch met an expert index out of range, received more rows than
    /// its outputs hold or rows of another size, or a combine through this handle found rows
    /// missing.
    pub fn read_handle(&self, handle: &BufferSlice, stream: &A::Stream) -> Result<Received> {
        let (n, local) = (self.nranks, self.local_experts());
        let words = handle_positions(n as u64, local as u64) as usize;
        let mut bytes = vec![0u8; 4 * words];
        stream.read_to_host(&mut bytes, &handle.slice(..4 * words)?)?;
        let at = |i: u64| {
            let i = i as usize * 4;
            i32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]])
        };
        let received = Received {
            per_source: (0..n as u64).map(|s| at(s).max(0) as usize).collect(),
            per_expert: (0..local as u64)
                .map(|e| at(handle_experts(n as u64) + e).max(0) as usize)
                .collect(),
        };
        let status = at(handle_status(n as u64));
        let known =
            STATUS_EXPERT_RANGE | STATUS_CAPACITY | STATUS_ROW_SIZE | STATUS_COMBINE_MISSING;
        if status == 0 {
            return Ok(received);
        }
        if status & !known != 0 {
            return Err(Error::invalid(format!(
                "a dispatch handle with status {status}: not a handle of this exchange"
            )));
        }
        let mut why = Vec::new();
        if status & STATUS_EXPERT_RANGE != 0 {
            why.push(format!(
                "an expert index outside -1..{} (the entry was dropped)",
                self.cfg.num_experts
            ));
        }
        if status & STATUS_CAPACITY != 0 {
            why.push(format!(
                "{} rows received for outputs that hold fewer (rows past them were dropped)",
                received.rows()
            ));
        }
        if status & STATUS_ROW_SIZE != 0 {
            why.push(
                "a source sent rows or scales of another size than this rank's (its rows were dropped)"
                    .into(),
            );
        }
        if status & STATUS_COMBINE_MISSING != 0 {
            why.push(
                "a combine found rows missing (a rank did not send them back, or it combined more tokens than the dispatch had): those tokens were summed without them"
                    .into(),
            );
        }
        Err(Error::invalid(format!(
            "rank {}'s dispatch: {}",
            self.rank,
            why.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_per_peer_keep_every_shared_grid_resident() {
        // An H100's 132 SMs: 2 ranks take 16 blocks per peer (the cap), 8 ranks 2.
        assert_eq!(blocks_per_peer(132, 2, None).unwrap(), 16);
        assert_eq!(blocks_per_peer(132, 4, None).unwrap(), 8);
        assert_eq!(blocks_per_peer(132, 8, None).unwrap(), 2);
        for (sms, n) in [(132u32, 3usize), (108, 8), (304, 5), (20, 8)] {
            let b = blocks_per_peer(sms, n, None).unwrap();
            assert!(
                b >= 1 && (b == 1 || b * (n * n) as u32 <= sms),
                "{sms} SMs, {n} ranks: {b}"
            );
        }
        assert_eq!(blocks_per_peer(132, 2, Some(3)).unwrap(), 3);
        let e = blocks_per_peer(132, 2, Some(0)).unwrap_err().to_string();
        assert!(e.contains("MSCCLPP_MOE_BLOCKS=0"), "{e}");
        assert!(blocks_per_peer(132, 2, Some(17)).is_err());
        // 16 per peer for 9 ranks would be 144 blocks on 132 SMs: never all resident.
        assert!(blocks_per_peer(132, 9, Some(16)).is_err());
        assert_eq!(blocks_per_peer(132, 8, Some(16)).unwrap(), 16);
        // Past the collectives' 8 ranks: one block per peer.
        assert_eq!(blocks_per_peer(132, 16, None).unwrap(), 1);
        assert_eq!(blocks_per_peer(132, MOE_MAX_RANKS, None).unwrap(), 1);
        assert!(blocks_per_peer(132, 16, Some(9)).is_err());
    }
}
