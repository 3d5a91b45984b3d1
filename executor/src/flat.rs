//! The flattened plan: one rank's part of a [`Plan`] for given buffer sizes, as fixed-size
//! `#[repr(C)]` records that live in device memory, so that the host interpreter and a device
//! interpreter (`kernels/executor.cu`, a later step) read the same bytes.
//!
//! Every chunk reference is resolved here to a byte offset and a byte size (threadblock-group
//! slices included); channel and remote-buffer ids are resolved to indexes into the rank's
//! tables; a pipeline is a header op followed by its body. What depends on the execution (the
//! LL flag, the scratch half) is left to the interpreter.

use mscclpp_hal::{Error, Result};

use crate::plan::{BufRef, BufferType, ChannelType, Op, OpKind, Plan, Protocol, Target};

/// Most buffer references per side of a flattened op.
pub const MAX_REFS: usize = crate::plan::MAX_BUFFERS_PER_OP;
/// Most channel or semaphore ids per flattened op.
pub const MAX_IDS: usize = crate::plan::MAX_IDS_PER_OP;

/// [`FlatRef::kind`]: a buffer of this rank.
pub const REF_LOCAL: u8 = 0;
/// [`FlatRef::kind`]: a peer's buffer mapped here (through a memory channel).
pub const REF_REMOTE_MEMORY: u8 = 1;
/// [`FlatRef::kind`]: a peer's buffer reached through the proxy (a port channel).
pub const REF_REMOTE_PORT: u8 = 2;
/// [`FlatRef::kind`]: a switch channel's buffer.
pub const REF_SWITCH: u8 = 3;

/// [`FlatOp::channel_type`] values.
pub const CHANNEL_NONE: u8 = 0;
/// See [`CHANNEL_NONE`].
pub const CHANNEL_MEMORY: u8 = 1;
/// See [`CHANNEL_NONE`].
pub const CHANNEL_PORT: u8 = 2;
/// See [`CHANNEL_NONE`].
pub const CHANNEL_SWITCH: u8 = 3;

/// One resolved buffer reference.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlatRef {
    /// Byte offset in the buffer (doubled already for packet references; the scratch half of a
    /// double-buffered scratch is added by the interpreter).
    pub offset: u64,
    /// Data bytes.
    pub size: u32,
    /// `REF_*`.
    pub kind: u8,
    /// The underlying [`BufferType`] (of the peer's buffer for remote references).
    pub buffer: u8,
    /// Remote buffer index (`REF_REMOTE_*`) or switch channel index (`REF_SWITCH`).
    pub id: u8,
    /// 1: the bytes at `offset` are LL16 packets (twice `size` bytes).
    pub packets: u8,
}

/// One operation.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlatOp {
    /// [`OpKind::code`].
    pub code: u8,
    /// `CHANNEL_*`.
    pub channel_type: u8,
    /// Sources used.
    pub n_src: u8,
    /// Destinations used.
    pub n_dst: u8,
    /// Ids used (channels, or semaphores for `sem_*`).
    pub n_ids: u8,
    /// [`mscclpp_hal::ReduceOp`] code.
    pub reduce: u8,
    /// Keeps the fields below aligned without implicit padding.
    pub _pad: [u8; 2],
    /// Barrier: its id; pipeline: bytes per iteration.
    pub a: u32,
    /// Barrier: blocks that meet; pipeline: iterations.
    pub b: u32,
    /// Pipeline: ops in its body (which follow it).
    pub c: u32,
    /// Keeps the struct free of implicit padding.
    pub _pad2: u32,
    /// Channel indexes into the rank's tables of `channel_type`, or semaphore ids.
    pub ids: [u8; MAX_IDS],
    /// Sources.
    pub src: [FlatRef; MAX_REFS],
    /// Destinations.
    pub dst: [FlatRef; MAX_REFS],
}

impl Default for FlatOp {
    fn default() -> Self {
        FlatOp {
            code: 0,
            channel_type: CHANNEL_NONE,
            n_src: 0,
            n_dst: 0,
            n_ids: 0,
            reduce: 0,
            _pad: [0; 2],
            a: 0,
            b: 0,
            c: 0,
            _pad2: 0,
            ids: [0; MAX_IDS],
            src: [FlatRef::default(); MAX_REFS],
            dst: [FlatRef::default(); MAX_REFS],
        }
    }
}

/// A threadblock: its ops are `ops[first_op .. first_op + n_ops]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlatBlock {
    /// Index of its first op in the op array.
    pub first_op: u32,
    /// Number of its ops (pipeline bodies included).
    pub n_ops: u32,
}

/// Buffer sizes of one execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sizes {
    /// Bytes of the input buffer.
    pub input: u64,
    /// Bytes of the output buffer.
    pub output: u64,
}

/// One rank's flattened plan for given sizes.
#[derive(Debug, Clone)]
pub struct FlatPlan {
    /// Threadblocks.
    pub blocks: Vec<FlatBlock>,
    /// Every op of every block.
    pub ops: Vec<FlatOp>,
    /// Bytes of the whole scratch buffer (both halves when double-buffered).
    pub scratch_bytes: u64,
}

/// How a plan cuts buffers into chunks for one execution.
#[derive(Debug, Clone, Copy)]
struct Chunking {
    /// Bytes the chunk indexes divide.
    base: u64,
    /// Chunks of `base`.
    n: u64,
    align: u64,
}

impl Chunking {
    /// Byte offset of chunk `index` (chunks are whole alignment units, the first ones one unit
    /// larger when they do not divide evenly).
    fn offset(&self, index: u64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let units = self.base / self.align;
        let (q, rem) = (units / self.n, units % self.n);
        // Saturating: indexes are bounded by the reader, sizes by memory; a product past u64 can
        // only come from a hostile plan and then fails the bounds check.
        index
            .saturating_mul(q)
            .saturating_add(index.min(rem))
            .saturating_mul(self.align)
    }

    /// The largest chunk, in bytes.
    fn upper_chunk(&self) -> u64 {
        if self.n == 0 {
            return 0;
        }
        (self.base / self.align).div_ceil(self.n) * self.align
    }
}

/// Offset of slice `i` of `slices` of a `size`-byte range, in alignment units.
fn slice_offset(size: u64, i: u64, slices: u64, align: u64) -> u64 {
    let units = size / align;
    (i * (units / slices) + i.min(units % slices)) * align
}

fn invalid(rank: usize, t: usize, i: usize, why: impl std::fmt::Display) -> Error {
    Error::invalid(format!(
        "execution plan gpus[{rank}].threadblocks[{t}].ops[{i}]: {why}"
    ))
}

/// Whether `rank`'s part of `plan` can run with buffers of `sizes`: the message (the output for
/// an all-gather, else the input) within the plan's range, and every buffer cut into whole
/// chunks of `buffer_alignment` units, the same size on both sides. Cheap: what a caller
/// choosing among plans asks before [`flatten`] (which checks it again).
pub fn check_sizes(plan: &Plan, rank: usize, sizes: Sizes) -> Result<()> {
    let gpu = plan.gpus.get(rank).ok_or_else(|| {
        Error::invalid(format!(
            "rank {rank}: the plan describes {} ranks",
            plan.nranks()
        ))
    })?;
    let align = plan.alignment;
    let msg = if plan.collective == "allgather" {
        sizes.output
    } else {
        sizes.input
    };
    if msg < plan.min_message_size || msg > plan.max_message_size {
        return Err(Error::invalid(format!(
            "plan {}: a message of {msg} bytes is outside its range {}..={}",
            plan.name, plan.min_message_size, plan.max_message_size
        )));
    }
    for (what, bytes, chunks) in [
        ("input", sizes.input, gpu.input_chunks),
        ("output", sizes.output, gpu.output_chunks),
    ] {
        if bytes % align != 0 || (chunks != 0 && (bytes / align) % chunks != 0) {
            return Err(Error::invalid(format!(
                "plan {}: the {what} of {bytes} bytes must be a multiple of {} ({chunks} chunks of whole {align}-byte units)",
                plan.name,
                align * chunks.max(1)
            )));
        }
    }
    if gpu.input_chunks != 0 && gpu.output_chunks != 0 {
        let per_input = sizes.input.checked_div(gpu.input_chunks);
        if per_input != sizes.output.checked_div(gpu.output_chunks) {
            return Err(Error::invalid(format!(
                "plan {}: input of {} bytes in {} chunks and output of {} bytes in {} chunks give different chunk sizes",
                plan.name, sizes.input, gpu.input_chunks, sizes.output, gpu.output_chunks
            )));
        }
    }
    Ok(())
}

/// Flattens `rank`'s part of `plan` for an execution with buffers of `sizes`.
pub fn flatten(plan: &Plan, rank: usize, sizes: Sizes) -> Result<FlatPlan> {
    let gpu = plan.gpus.get(rank).ok_or_else(|| {
        Error::invalid(format!(
            "rank {rank}: the plan describes {} ranks",
            plan.nranks()
        ))
    })?;
    check_sizes(plan, rank, sizes)?;
    let align = plan.alignment;
    let chunking = if gpu.input_chunks != 0 {
        Chunking {
            base: sizes.input,
            n: gpu.input_chunks,
            align,
        }
    } else {
        Chunking {
            base: sizes.output,
            n: gpu.output_chunks,
            align,
        }
    };
    let packet_factor = if plan.protocol == Protocol::Ll { 2 } else { 1 };
    let scratch_half =
        (chunking.upper_chunk() * gpu.scratch_chunks * packet_factor).next_multiple_of(align);
    let scratch_bytes = if plan.double_scratch {
        scratch_half * 2
    } else {
        scratch_half
    };
    let buffer_bytes = |b: BufferType| match b {
        BufferType::Input => sizes.input,
        BufferType::Output => sizes.output,
        BufferType::Scratch => scratch_half,
    };
    let switch = gpu.switch_channels();
    let mut blocks = Vec::with_capacity(gpu.threadblocks.len());
    let mut ops = Vec::new();
    for (t, tb) in gpu.threadblocks.iter().enumerate() {
        let first = ops.len();
        for (i, op) in tb.ops.iter().enumerate() {
            let cx = Cx {
                rank,
                t,
                i,
                chunking,
                buffer_bytes: &buffer_bytes,
                switch: &switch,
            };
            let mut f = flatten_op(op, &cx)?;
            if let Some(p) = &op.pipeline {
                let total = p.num_chunks.saturating_mul(chunking.upper_chunk());
                let iterations = total.div_ceil(p.unit_size);
                f.a = u32::try_from(p.unit_size)
                    .map_err(|_| invalid(rank, t, i, "pipeline unit_size past 4 GiB"))?;
                f.b = u32::try_from(iterations)
                    .map_err(|_| invalid(rank, t, i, "more than 2^32 pipeline iterations"))?;
                f.c = p.ops.len() as u32;
                ops.push(f);
                for inner in &p.ops {
                    ops.push(flatten_op(inner, &cx)?);
                }
            } else {
                ops.push(f);
            }
        }
        blocks.push(FlatBlock {
            first_op: first as u32,
            n_ops: (ops.len() - first) as u32,
        });
    }
    Ok(FlatPlan {
        blocks,
        ops,
        scratch_bytes,
    })
}

struct Cx<'a> {
    rank: usize,
    t: usize,
    i: usize,
    chunking: Chunking,
    buffer_bytes: &'a dyn Fn(BufferType) -> u64,
    switch: &'a [(BufferType, u64, Vec<usize>)],
}

/// Which references of `kind` hold packets rather than data (`(side is dst, position)`).
fn is_packet_ref(kind: OpKind, dst: bool, pos: usize, channel: Option<ChannelType>) -> bool {
    use OpKind as K;
    match kind {
        // Through memory channels the source is data; through port channels the proxy copies
        // packets that a `cpkt` prepared in local scratch.
        K::PutPackets => dst || channel == Some(ChannelType::Port),
        K::ReadPutPackets | K::MultiStorePackets => true,
        K::CopyPackets => dst,
        K::UnpackPackets => !dst,
        K::ReducePackets
        | K::ReduceSendPackets
        | K::ReduceCopyPackets
        | K::ReduceCopySendPackets => pos >= 1,
        _ => false,
    }
}

fn flatten_op(op: &Op, cx: &Cx<'_>) -> Result<FlatOp> {
    let mut f = FlatOp {
        code: op.kind.code(),
        channel_type: match op.channel_type {
            None => CHANNEL_NONE,
            Some(ChannelType::Memory) => CHANNEL_MEMORY,
            Some(ChannelType::Port) => CHANNEL_PORT,
            Some(ChannelType::Switch) => CHANNEL_SWITCH,
        },
        reduce: op.reduce as u8,
        ..FlatOp::default()
    };
    let ids = if matches!(op.kind, OpKind::SemAcquire | OpKind::SemRelease) {
        &op.semaphores
    } else {
        &op.channels
    };
    f.n_ids = ids.len() as u8;
    for (k, &id) in ids.iter().enumerate() {
        // Ids are below MAX_PER_RANK (255), checked by the reader.
        f.ids[k] = id as u8;
    }
    if let Some((id, n)) = op.barrier {
        f.a = id;
        f.b = n;
    }
    for (dst, list) in [(false, &op.src), (true, &op.dst)] {
        for (pos, r) in list.iter().enumerate() {
            let packets = is_packet_ref(op.kind, dst, pos, op.channel_type);
            let fr = flatten_ref(r, packets, op, cx)?;
            if dst {
                f.dst[pos] = fr;
            } else {
                f.src[pos] = fr;
            }
        }
    }
    f.n_src = op.src.len() as u8;
    f.n_dst = op.dst.len() as u8;
    Ok(f)
}

fn flatten_ref(r: &BufRef, packets: bool, op: &Op, cx: &Cx<'_>) -> Result<FlatRef> {
    let c = cx.chunking;
    let mut offset = c.offset(r.index);
    let mut size = c.offset(r.index + r.size).saturating_sub(offset);
    if let Some((tb, n)) = op.tbg {
        let (tb, n) = (u64::from(tb), u64::from(n));
        let begin = slice_offset(size, tb, n, c.align);
        let end = slice_offset(size, tb + 1, n, c.align);
        offset += begin;
        size = end - begin;
    }
    let (kind, buffer, id) = match r.target {
        Target::Local(b) => (REF_LOCAL, b, 0),
        Target::Remote { remote, buffer, .. } => (
            if op.channel_type == Some(ChannelType::Port) {
                REF_REMOTE_PORT
            } else {
                REF_REMOTE_MEMORY
            },
            buffer,
            remote,
        ),
        Target::Switch { channel, .. } => (REF_SWITCH, cx.switch[channel].0, channel),
    };
    let (offset, extent) = if packets {
        (offset.saturating_mul(2), size.saturating_mul(2))
    } else {
        (offset, size)
    };
    let limit = (cx.buffer_bytes)(buffer);
    if offset.saturating_add(extent) > limit {
        return Err(invalid(
            cx.rank,
            cx.t,
            cx.i,
            format!(
                "{}: bytes {offset}..{} of buffer {} lie past its {limit} bytes",
                op.kind,
                offset + extent,
                buffer.name()
            ),
        ));
    }
    let size = u32::try_from(size).map_err(|_| {
        invalid(
            cx.rank,
            cx.t,
            cx.i,
            format!("{}: {size} bytes in one reference, at most 4 GiB", op.kind),
        )
    })?;
    Ok(FlatRef {
        offset,
        size,
        kind,
        buffer: buffer as u8,
        id: id as u8,
        packets: u8::from(packets),
    })
}
