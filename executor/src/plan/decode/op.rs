//! Decoding one operation of a threadblock. [`read_op`] reads the fields in a fixed order and
//! hands each group to a helper: the channels that signal/wait/flush operations name, the
//! buffer references that data movement and reductions name, the barrier, the semaphores of
//! `sem_acquire`/`sem_release`, a thread-block group's share, and a pipeline's body. The order
//! is part of the behaviour: a plan with several faults is reported by the first one read.

use mscclpp_hal::{ReduceOp, Result};
use serde_json::{Map, Value};

use crate::plan::json::{
    Path, array, as_u64, bad, buffer_type, channel_type, get, indexes, kind_of, object, str_field,
    u64_field,
};
use crate::plan::limits::{
    MAX_BARRIERS, MAX_BUFFERS_PER_OP, MAX_CHUNKS, MAX_IDS_PER_OP, MAX_OPS, MAX_THREADBLOCKS,
};
use crate::plan::types::{BufRef, ChannelType, Gpu, Op, OpKind, PipelineInfo, Target, Threadblock};
use crate::plan::validate;

/// What an operation's references resolve against: its rank (and every rank's declarations,
/// for peers' buffers) and its threadblock's channels and remote buffers.
pub(super) struct Scope<'a> {
    /// The rank whose threadblock holds the operation.
    pub(super) rank: usize,
    /// Every rank's declarations (pass 1 of the decoder).
    pub(super) gpus: &'a [Gpu],
    /// The operation's threadblock, its channels and remote buffers already read.
    pub(super) tb: &'a Threadblock,
    /// Threadblocks of the rank (a barrier's `num_threadblocks` is at most this).
    pub(super) n_tbs: usize,
}

impl Scope<'_> {
    fn gpu(&self) -> &Gpu {
        &self.gpus[self.rank]
    }
}

/// Decodes the operation `v` at `path`; `outer` is false inside a pipeline's body (which may not
/// hold another pipeline).
pub(super) fn read_op(v: &Value, path: &Path, scope: &Scope<'_>, outer: bool) -> Result<Op> {
    let o = object(v, path)?;
    let kind = read_kind(o, path)?;
    let channel_type = read_channel_type(o, path)?;
    let mut op = Op {
        kind,
        channel_type,
        channels: Vec::new(),
        src: Vec::new(),
        dst: Vec::new(),
        reduce: ReduceOp::Sum,
        barrier: None,
        semaphores: Vec::new(),
        tbg: None,
        pipeline: None,
    };
    op.channels = read_channel_ids(o, path, kind, channel_type, scope.tb)?;
    op.src = read_buffers(o, "src_buff", path, channel_type, scope)?;
    op.dst = read_buffers(o, "dst_buff", path, channel_type, scope)?;
    if let Some(reduce) = read_reduce_op(o, path)? {
        op.reduce = reduce;
    }
    if kind == OpKind::Barrier {
        op.barrier = Some(read_barrier(o, path, scope.n_tbs)?);
    }
    op.semaphores = read_semaphore_ids(o, path, kind, scope)?;
    op.tbg = read_tbg(o, path)?;
    if kind == OpKind::Pipeline {
        if !outer {
            return Err(bad(path, "a pipeline inside a pipeline"));
        }
        op.pipeline = Some(read_pipeline(o, path, scope)?);
    }
    validate::check_shape(&op, path)?;
    Ok(op)
}

/// `name`: which operation.
fn read_kind(o: &Map<String, Value>, path: &Path) -> Result<OpKind> {
    let name = str_field(o, "name", path)?;
    OpKind::parse(name).ok_or_else(|| {
        let known: Vec<&str> = OpKind::ALL.iter().map(|k| k.name()).collect();
        bad(
            &path.key("name"),
            format!("unknown operation {name:?} (known: {})", known.join(", ")),
        )
    })
}

/// `channel_type`, where `"none"` (what the DSL writes for local operations) is absent.
fn read_channel_type(o: &Map<String, Value>, path: &Path) -> Result<Option<ChannelType>> {
    match o.get("channel_type") {
        None => Ok(None),
        Some(Value::String(s)) if s == "none" => Ok(None),
        Some(Value::String(s)) => Ok(Some(channel_type(s, &path.key("channel_type"))?)),
        Some(x) => Err(bad(
            &path.key("channel_type"),
            format!("expected a string, found {}", kind_of(x)),
        )),
    }
}

/// `channel_ids`, resolved through the threadblock's channels of the op's type to the rank's:
/// required by the operations that signal, wait or flush, which go through memory or port
/// channels only.
fn read_channel_ids(
    o: &Map<String, Value>,
    path: &Path,
    kind: OpKind,
    channel_type: Option<ChannelType>,
    tb: &Threadblock,
) -> Result<Vec<usize>> {
    let mut channels = Vec::new();
    if let Some(ids) = o.get("channel_ids") {
        let ip = path.key("channel_ids");
        let ty = channel_type.ok_or_else(|| {
            bad(
                &path.key("channel_type"),
                "missing: channel_ids need a channel_type",
            )
        })?;
        let list = match ty {
            ChannelType::Memory => &tb.memory_channels,
            ChannelType::Port => &tb.port_channels,
            ChannelType::Switch => &tb.switch_channels,
        };
        for (j, id) in indexes(ids, &ip, MAX_IDS_PER_OP)?.into_iter().enumerate() {
            let ch = list.get(id).ok_or_else(|| {
                bad(
                    &ip.at(j),
                    format!(
                        "{} channel {id} does not exist: the threadblock has {}",
                        ty.name(),
                        list.len()
                    ),
                )
            })?;
            channels.push(*ch);
        }
    } else if kind.needs_channel_ids() {
        return Err(bad(
            &path.key("channel_ids"),
            format!("missing: {kind} needs channels"),
        ));
    }
    if kind.needs_channel_ids() && channel_type == Some(ChannelType::Switch) {
        return Err(bad(
            &path.key("channel_type"),
            format!("{kind} goes through memory or port channels, not switch"),
        ));
    }
    Ok(channels)
}

/// One side (`src_buff` or `dst_buff`) of the op's buffer references; empty where absent.
fn read_buffers(
    o: &Map<String, Value>,
    side: &str,
    path: &Path,
    channel_type: Option<ChannelType>,
    scope: &Scope<'_>,
) -> Result<Vec<BufRef>> {
    let Some(list) = o.get(side) else {
        return Ok(Vec::new());
    };
    let sp = path.key(side);
    let mut refs = Vec::new();
    for (j, b) in array(list, &sp, MAX_BUFFERS_PER_OP)?.iter().enumerate() {
        refs.push(read_buf_ref(b, &sp.at(j), path, channel_type, scope)?);
    }
    Ok(refs)
}

/// One buffer reference at `bp` of the op at `path`: a peer's buffer (`buffer_id`), a switch
/// channel's (`switch_channel_id`) or one of this rank's (`type`), its chunks in range.
fn read_buf_ref(
    b: &Value,
    bp: &Path,
    path: &Path,
    channel_type: Option<ChannelType>,
    scope: &Scope<'_>,
) -> Result<BufRef> {
    let gpu = scope.gpu();
    let bo = object(b, bp)?;
    let index = u64_field(bo, "index", bp)?;
    let size = u64_field(bo, "size", bp)?;
    let (target, chunks, what) = if let Some(id) = bo.get("buffer_id") {
        remote_target(id, bp, path, channel_type, scope)?
    } else if let Some(id) = bo.get("switch_channel_id") {
        switch_target(id, bp, scope)?
    } else {
        let s = str_field(bo, "type", bp)?;
        let b = buffer_type(s, &bp.key("type"))?;
        (
            Target::Local(b),
            gpu.chunks(b),
            format!("buffer {}", b.name()),
        )
    };
    validate::check_chunk_range(index, size, chunks, &what, &bp.key("index"))?;
    Ok(BufRef {
        target,
        index,
        size,
    })
}

/// A `buffer_id`: the threadblock's remote buffer of the op's channel type, with its owner's
/// chunk count and a name for errors.
fn remote_target(
    id: &Value,
    bp: &Path,
    path: &Path,
    channel_type: Option<ChannelType>,
    scope: &Scope<'_>,
) -> Result<(Target, u64, String)> {
    let (tb, gpu) = (scope.tb, scope.gpu());
    let id = as_u64(id, &bp.key("buffer_id"))? as usize;
    let ty = channel_type.ok_or_else(|| {
        bad(
            &path.key("channel_type"),
            "missing: a buffer_id needs a channel_type",
        )
    })?;
    let list = match ty {
        ChannelType::Memory => &tb.memory_buffers,
        ChannelType::Port => &tb.port_buffers,
        ChannelType::Switch => {
            return Err(bad(
                &bp.key("buffer_id"),
                "a buffer_id through a switch channel",
            ));
        }
    };
    let remote = *list.get(id).ok_or_else(|| {
        bad(
            &bp.key("buffer_id"),
            format!(
                "remote buffer {id} does not exist: the threadblock references {} through {} channels",
                list.len(),
                ty.name()
            ),
        )
    })?;
    let rb = &gpu.remote_buffers[remote];
    Ok((
        Target::Remote {
            id,
            remote,
            rank: rb.rank,
            buffer: rb.buffer,
        },
        scope.gpus[rb.rank].chunks(rb.buffer),
        format!("buffer {} of rank {}", rb.buffer.name(), rb.rank),
    ))
}

/// A `switch_channel_id`: the threadblock's switch channel, with its buffer's chunk count and a
/// name for errors.
fn switch_target(id: &Value, bp: &Path, scope: &Scope<'_>) -> Result<(Target, u64, String)> {
    let (tb, gpu) = (scope.tb, scope.gpu());
    let id = as_u64(id, &bp.key("switch_channel_id"))? as usize;
    let channel = *tb.switch_channels.get(id).ok_or_else(|| {
        bad(
            &bp.key("switch_channel_id"),
            format!(
                "switch channel {id} does not exist: the threadblock has {}",
                tb.switch_channels.len()
            ),
        )
    })?;
    let (buffer, _, _) = gpu.switch_channels()[channel];
    Ok((
        Target::Switch { id, channel },
        gpu.chunks(buffer),
        format!("switch buffer {}", buffer.name()),
    ))
}

/// `reduce_op`, if given.
fn read_reduce_op(o: &Map<String, Value>, path: &Path) -> Result<Option<ReduceOp>> {
    let Some(rv) = o.get("reduce_op") else {
        return Ok(None);
    };
    let rp = path.key("reduce_op");
    let s = rv
        .as_str()
        .ok_or_else(|| bad(&rp, format!("expected a string, found {}", kind_of(rv))))?;
    Ok(Some(s.parse().map_err(|e| bad(&rp, e))?))
}

/// A barrier's `barrier_id` and `num_threadblocks`.
fn read_barrier(o: &Map<String, Value>, path: &Path, n_tbs: usize) -> Result<(u32, u32)> {
    let id = u64_field(o, "barrier_id", path)?;
    let n = u64_field(o, "num_threadblocks", path)?;
    if id >= u64::from(MAX_BARRIERS) {
        return Err(bad(
            &path.key("barrier_id"),
            format!("{id}: at most {MAX_BARRIERS} barriers"),
        ));
    }
    if n == 0 || n > n_tbs as u64 {
        return Err(bad(
            &path.key("num_threadblocks"),
            format!("{n}: between 1 and the rank's threadblocks expected"),
        ));
    }
    Ok((id as u32, n as u32))
}

/// `semaphore_ids`, each one the rank declares: required by `sem_acquire` and `sem_release`.
fn read_semaphore_ids(
    o: &Map<String, Value>,
    path: &Path,
    kind: OpKind,
    scope: &Scope<'_>,
) -> Result<Vec<usize>> {
    let (gpu, r) = (scope.gpu(), scope.rank);
    let mut semaphores = Vec::new();
    if let Some(ids) = o.get("semaphore_ids") {
        let ip = path.key("semaphore_ids");
        for (j, id) in indexes(ids, &ip, MAX_IDS_PER_OP)?.into_iter().enumerate() {
            if id >= gpu.semaphores.len() {
                return Err(bad(
                    &ip.at(j),
                    format!(
                        "semaphore {id} does not exist: rank {r} declares {}",
                        gpu.semaphores.len()
                    ),
                ));
            }
            semaphores.push(id);
        }
    } else if matches!(kind, OpKind::SemAcquire | OpKind::SemRelease) {
        return Err(bad(
            &path.key("semaphore_ids"),
            "missing (a required field)",
        ));
    }
    Ok(semaphores)
}

/// `tbg_info`, if given: (`tb_id`, `tbg_size`).
fn read_tbg(o: &Map<String, Value>, path: &Path) -> Result<Option<(u32, u32)>> {
    let Some(t) = o.get("tbg_info") else {
        return Ok(None);
    };
    let tp = path.key("tbg_info");
    let to = object(t, &tp)?;
    let id = u64_field(to, "tb_id", &tp)?;
    let size = u64_field(to, "tbg_size", &tp)?;
    if size == 0 || id >= size || size > MAX_THREADBLOCKS as u64 {
        return Err(bad(&tp, format!("tb_id {id} of tbg_size {size}")));
    }
    Ok(Some((id as u32, size as u32)))
}

/// A pipeline's `iter_context` and its body (`ops`), read as inner operations.
fn read_pipeline(o: &Map<String, Value>, path: &Path, scope: &Scope<'_>) -> Result<PipelineInfo> {
    let ip = path.key("iter_context");
    let io = object(get(o, "iter_context", path)?, &ip)?;
    let unit_size = u64_field(io, "unit_size", &ip)?;
    let num_chunks = u64_field(io, "num_chunks", &ip)?;
    if unit_size == 0 || num_chunks > MAX_CHUNKS {
        return Err(bad(
            &ip,
            format!("unit_size {unit_size}, num_chunks {num_chunks}: a positive unit is needed"),
        ));
    }
    let bp = path.key("ops");
    let mut body = Vec::new();
    for (j, inner) in array(get(o, "ops", path)?, &bp, MAX_OPS)?
        .iter()
        .enumerate()
    {
        body.push(read_op(inner, &bp.at(j), scope, false)?);
    }
    Ok(PipelineInfo {
        unit_size,
        num_chunks,
        ops: body,
    })
}
