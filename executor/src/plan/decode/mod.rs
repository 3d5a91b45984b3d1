//! Decoding a plan from JSON into the typed plan, in two passes over the ranks: first what each
//! rank declares (buffer sizes, channels, remote buffers, semaphores), then its threadblocks,
//! whose references are resolved against every rank's declarations (a put names a peer's
//! buffer, so the peer's chunk count must be known). Operations are decoded in [`op`].
//!
//! Checks that need only the value being read (a reference in range, a known name) happen as
//! it is read, so that the error names the field; checks of a whole decoded value are in
//! `validate`.

mod op;

use mscclpp_hal::Result;
use serde_json::{Map, Value};

use super::json::{
    Path, array, array_or_empty, bad, bool_field, buffer_type, channel_type, get, index_field,
    indexes, kind_of, object, str_field, u64_field, u64_or,
};
use super::limits::{MAX_CHUNKS, MAX_GPUS, MAX_OPS, MAX_PER_RANK, MAX_THREADBLOCKS};
use super::types::{ChannelDef, ChannelType, Gpu, Op, Plan, Protocol, RemoteBuffer, Threadblock};
use super::validate;

/// Decodes and validates `v` as a plan for `nranks` ranks.
pub(super) fn plan(v: &Value, nranks: usize) -> Result<Plan> {
    let root = Path::root();
    let o = object(v, &root)?;
    let protocol = match str_field(o, "protocol", &root)? {
        "Simple" => Protocol::Simple,
        "LL" => Protocol::Ll,
        other => {
            return Err(bad(
                &root.key("protocol"),
                format!("unknown protocol {other:?} (expected \"Simple\" or \"LL\")"),
            ));
        }
    };
    let alignment = u64_or(o, "buffer_alignment", 16, &root)?;
    validate::check_alignment(alignment, &root.key("buffer_alignment"))?;
    let threads = u64_or(o, "num_threads_per_block", 1024, &root)?;
    validate::check_threads(threads, &root.key("num_threads_per_block"))?;
    let gpus_path = root.key("gpus");
    let gpus_v = array(get(o, "gpus", &root)?, &gpus_path, MAX_GPUS)?;
    if gpus_v.len() != nranks {
        return Err(bad(
            &gpus_path,
            format!(
                "the plan is for {} ranks but the communicator has {nranks}",
                gpus_v.len()
            ),
        ));
    }
    // Pass 1: what every rank declares (peers' chunk counts and remote buffers are needed to
    // check references), then pass 2: the threadblocks.
    let mut gpus = Vec::with_capacity(gpus_v.len());
    for (r, g) in gpus_v.iter().enumerate() {
        let ranks = Ranks {
            this: r,
            count: nranks,
        };
        gpus.push(read_gpu_decls(g, ranks, &gpus_path.at(r))?);
    }
    for (r, g) in gpus_v.iter().enumerate() {
        let tbs = read_threadblocks(g, r, &gpus, &gpus_path.at(r))?;
        gpus[r].threadblocks = tbs;
    }
    Ok(Plan {
        name: str_field(o, "name", &root)?.to_owned(),
        collective: str_field(o, "collective", &root)?.to_owned(),
        protocol,
        inplace: bool_field(o, "inplace", None, &root)?,
        reuse_resources: bool_field(o, "reuse_resources", Some(false), &root)?,
        threads_per_block: threads as u32,
        double_scratch: bool_field(o, "use_double_scratch_buffer", Some(false), &root)?,
        alignment,
        min_message_size: u64_or(o, "min_message_size", 0, &root)?,
        max_message_size: u64_or(o, "max_message_size", u64::MAX, &root)?,
        gpus,
    })
}

/// The rank being decoded and how many the plan has: what a peer reference is checked against.
#[derive(Clone, Copy)]
struct Ranks {
    this: usize,
    count: usize,
}

impl Ranks {
    /// `v` if it names another rank of the plan.
    fn peer(self, v: usize, p: &Path) -> Result<usize> {
        let Ranks {
            this: r,
            count: nranks,
        } = self;
        if v >= nranks || v == r {
            Err(bad(
                p,
                format!("peer {v} is not another rank of {nranks} (this is rank {r})"),
            ))
        } else {
            Ok(v)
        }
    }
}

/// Pass 1 for one rank: everything but its threadblocks.
fn read_gpu_decls(g: &Value, ranks: Ranks, path: &Path) -> Result<Gpu> {
    let o = object(g, path)?;
    let r = ranks.this;
    let id = u64_field(o, "id", path)?;
    if id != r as u64 {
        return Err(bad(
            &path.key("id"),
            format!("{id}, but entry {r} of gpus must describe rank {r}"),
        ));
    }
    let chunks = read_chunks(o, path)?;
    // Both 0 is legal for plans that move no data (signal/wait tests); an op naming a chunk
    // then fails the chunk-range check of its buffer reference.
    let ch_path = path.key("channels");
    let mut channels = Vec::new();
    for (i, c) in array_or_empty(o, "channels", path, MAX_PER_RANK)?
        .iter()
        .enumerate()
    {
        channels.push(read_channel_def(c, ranks, &ch_path.at(i))?);
    }
    let rb_path = path.key("remote_buffers");
    let mut remote_buffers = Vec::new();
    for (i, b) in array_or_empty(o, "remote_buffers", path, MAX_PER_RANK)?
        .iter()
        .enumerate()
    {
        remote_buffers.push(read_remote_buffer(b, ranks, &rb_path.at(i))?);
    }
    let semaphores = read_semaphores(o, path)?;
    let gpu = Gpu {
        input_chunks: chunks[0],
        output_chunks: chunks[1],
        scratch_chunks: chunks[2],
        channels,
        remote_buffers,
        semaphores,
        threadblocks: Vec::new(),
    };
    validate::check_channel_counts(&gpu, &ch_path)?;
    Ok(gpu)
}

/// `input_chunks`, `output_chunks`, `scratch_chunks`, in that order.
fn read_chunks(o: &Map<String, Value>, path: &Path) -> Result<[u64; 3]> {
    let mut chunks = [0u64; 3];
    for (i, k) in ["input_chunks", "output_chunks", "scratch_chunks"]
        .iter()
        .enumerate()
    {
        chunks[i] = u64_field(o, k, path)?;
        if chunks[i] > MAX_CHUNKS {
            return Err(bad(
                &path.key(k),
                format!("{}: at most {MAX_CHUNKS} chunks", chunks[i]),
            ));
        }
    }
    Ok(chunks)
}

/// One entry of a rank's `channels`.
fn read_channel_def(c: &Value, ranks: Ranks, cp: &Path) -> Result<ChannelDef> {
    let co = object(c, cp)?;
    let ty = channel_type(str_field(co, "channel_type", cp)?, &cp.key("channel_type"))?;
    match ty {
        ChannelType::Memory | ChannelType::Port => {
            let pp = cp.key("connected_to");
            let peers = indexes(get(co, "connected_to", cp)?, &pp, MAX_PER_RANK)?
                .into_iter()
                .enumerate()
                .map(|(j, p)| ranks.peer(p, &pp.at(j)))
                .collect::<Result<Vec<_>>>()?;
            Ok(if ty == ChannelType::Memory {
                ChannelDef::Memory(peers)
            } else {
                ChannelDef::Port(peers)
            })
        }
        ChannelType::Switch => {
            let buffer = buffer_type(str_field(co, "buffer_type", cp)?, &cp.key("buffer_type"))?;
            let gp = cp.key("rank_groups");
            let mut groups = Vec::new();
            for (j, grp) in array(get(co, "rank_groups", cp)?, &gp, MAX_PER_RANK)?
                .iter()
                .enumerate()
            {
                groups.push(read_rank_group(grp, ranks.count, &gp.at(j))?);
            }
            Ok(ChannelDef::Switch { buffer, groups })
        }
    }
}

/// One `rank_groups` entry of a switch channel: (chunks, ranks).
fn read_rank_group(grp: &Value, nranks: usize, jp: &Path) -> Result<(u64, Vec<usize>)> {
    let go = object(grp, jp)?;
    let size = u64_field(go, "size", jp)?;
    let ranks = indexes(get(go, "ranks", jp)?, &jp.key("ranks"), MAX_GPUS)?;
    if let Some(bad_rank) = ranks.iter().find(|&&x| x >= nranks) {
        return Err(bad(
            &jp.key("ranks"),
            format!("rank {bad_rank} does not exist (the plan has {nranks})"),
        ));
    }
    Ok((size, ranks))
}

/// One entry of a rank's `remote_buffers`.
fn read_remote_buffer(b: &Value, ranks: Ranks, bp: &Path) -> Result<RemoteBuffer> {
    let bo = object(b, bp)?;
    let rank = index_field(bo, "rank", bp)?;
    let rank = ranks.peer(rank, &bp.key("rank"))?;
    let buffer = buffer_type(str_field(bo, "type", bp)?, &bp.key("type"))?;
    let ap = bp.key("access_channel_types");
    let mut access = Vec::new();
    for (j, a) in array(get(bo, "access_channel_types", bp)?, &ap, 4)?
        .iter()
        .enumerate()
    {
        let s = a.as_str().ok_or_else(|| {
            bad(
                &ap.at(j),
                format!("expected a string, found {}", kind_of(a)),
            )
        })?;
        access.push(channel_type(s, &ap.at(j))?);
    }
    Ok(RemoteBuffer {
        rank,
        buffer,
        access,
    })
}

/// A rank's `semaphores`: their initial values.
fn read_semaphores(o: &Map<String, Value>, path: &Path) -> Result<Vec<u32>> {
    let sp = path.key("semaphores");
    let mut semaphores = Vec::new();
    for (i, s) in array_or_empty(o, "semaphores", path, MAX_PER_RANK)?
        .iter()
        .enumerate()
    {
        let so = object(s, &sp.at(i))?;
        let v = u64_field(so, "init_value", &sp.at(i))?;
        semaphores.push(u32::try_from(v).map_err(|_| {
            bad(
                &sp.at(i).key("init_value"),
                format!("{v} does not fit 32 bits"),
            )
        })?);
    }
    Ok(semaphores)
}

/// Pass 2 for rank `r`: its threadblocks, by id.
fn read_threadblocks(g: &Value, r: usize, gpus: &[Gpu], path: &Path) -> Result<Vec<Threadblock>> {
    let o = object(g, path)?;
    let gpu = &gpus[r];
    let tp = path.key("threadblocks");
    let tbs_v = array(get(o, "threadblocks", path)?, &tp, MAX_THREADBLOCKS)?;
    let mut tbs: Vec<Option<Threadblock>> = vec![None; tbs_v.len()];
    let declared = Declared {
        memory: gpu.peers(ChannelType::Memory).len(),
        port: gpu.peers(ChannelType::Port).len(),
        switch: gpu.switch_channels().len(),
    };
    for (t, tb) in tbs_v.iter().enumerate() {
        let p = tp.at(t);
        let to = object(tb, &p)?;
        let id = index_field(to, "id", &p)?;
        if id >= tbs_v.len() || tbs[id].is_some() {
            return Err(bad(
                &p.key("id"),
                format!(
                    "{id}: threadblock ids must be 0 to {} and each used once",
                    tbs_v.len().saturating_sub(1)
                ),
            ));
        }
        let mut block = Threadblock {
            ops: Vec::new(),
            memory_channels: Vec::new(),
            port_channels: Vec::new(),
            switch_channels: Vec::new(),
            memory_buffers: Vec::new(),
            port_buffers: Vec::new(),
        };
        read_tb_channels(to, &p, r, declared, &mut block)?;
        read_tb_remote_buffers(to, &p, r, gpu, &mut block)?;
        let scope = op::Scope {
            rank: r,
            gpus,
            tb: &block,
            n_tbs: tbs_v.len(),
        };
        let ops = read_tb_ops(to, &p, &scope)?;
        block.ops = ops;
        tbs[id] = Some(block);
    }
    // Every id from 0 to len-1 was used exactly once (checked above), so all are filled.
    Ok(tbs.into_iter().flatten().collect())
}

/// How many channels of each type a rank declares: what a threadblock's channel ids index.
#[derive(Clone, Copy)]
struct Declared {
    memory: usize,
    port: usize,
    switch: usize,
}

/// A threadblock's `channels`: which of the rank's channels it uses, by type.
fn read_tb_channels(
    to: &Map<String, Value>,
    p: &Path,
    r: usize,
    declared: Declared,
    block: &mut Threadblock,
) -> Result<()> {
    let cp = p.key("channels");
    for (i, c) in array_or_empty(to, "channels", p, MAX_PER_RANK)?
        .iter()
        .enumerate()
    {
        let ip = cp.at(i);
        let co = object(c, &ip)?;
        let ty = channel_type(str_field(co, "channel_type", &ip)?, &ip.key("channel_type"))?;
        let idp = ip.key("channel_ids");
        let ids = indexes(get(co, "channel_ids", &ip)?, &idp, MAX_PER_RANK)?;
        let (list, n) = match ty {
            ChannelType::Memory => (&mut block.memory_channels, declared.memory),
            ChannelType::Port => (&mut block.port_channels, declared.port),
            ChannelType::Switch => (&mut block.switch_channels, declared.switch),
        };
        for (j, id) in ids.into_iter().enumerate() {
            if id >= n {
                return Err(bad(
                    &idp.at(j),
                    format!(
                        "{} channel {id} does not exist: rank {r} declares {n}",
                        ty.name()
                    ),
                ));
            }
            list.push(id);
        }
        if list.len() > MAX_PER_RANK {
            return Err(bad(
                &cp,
                format!("more than {MAX_PER_RANK} {} channels", ty.name()),
            ));
        }
    }
    Ok(())
}

/// A threadblock's `remote_buffer_refs`: which of the rank's remote buffers it reaches, through
/// which channel type.
fn read_tb_remote_buffers(
    to: &Map<String, Value>,
    p: &Path,
    r: usize,
    gpu: &Gpu,
    block: &mut Threadblock,
) -> Result<()> {
    let rp = p.key("remote_buffer_refs");
    for (i, c) in array_or_empty(to, "remote_buffer_refs", p, MAX_PER_RANK)?
        .iter()
        .enumerate()
    {
        let ip = rp.at(i);
        let co = object(c, &ip)?;
        let ty = channel_type(
            str_field(co, "access_channel_type", &ip)?,
            &ip.key("access_channel_type"),
        )?;
        let idp = ip.key("remote_buffer_ids");
        for (j, id) in indexes(get(co, "remote_buffer_ids", &ip)?, &idp, MAX_PER_RANK)?
            .into_iter()
            .enumerate()
        {
            let rb = gpu.remote_buffers.get(id).ok_or_else(|| {
                bad(
                    &idp.at(j),
                    format!(
                        "remote buffer {id} does not exist: rank {r} declares {}",
                        gpu.remote_buffers.len()
                    ),
                )
            })?;
            if !rb.access.contains(&ty) {
                return Err(bad(
                    &idp.at(j),
                    format!(
                        "remote buffer {id} is not declared accessible through {} channels",
                        ty.name()
                    ),
                ));
            }
            match ty {
                ChannelType::Memory => block.memory_buffers.push(id),
                ChannelType::Port => block.port_buffers.push(id),
                ChannelType::Switch => {
                    return Err(bad(
                        &ip.key("access_channel_type"),
                        "remote buffers are reached through memory or port channels",
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A threadblock's `ops`, pipeline bodies counted against [`MAX_OPS`].
fn read_tb_ops(to: &Map<String, Value>, p: &Path, scope: &op::Scope<'_>) -> Result<Vec<Op>> {
    let op_path = p.key("ops");
    let ops_v = array(get(to, "ops", p)?, &op_path, MAX_OPS)?;
    let mut ops = Vec::new();
    let mut total = 0usize;
    for (i, v) in ops_v.iter().enumerate() {
        let parsed = op::read_op(v, &op_path.at(i), scope, true)?;
        total += 1 + parsed.pipeline.as_ref().map_or(0, |p| p.ops.len());
        if total > MAX_OPS {
            return Err(bad(&op_path, format!("more than {MAX_OPS} operations")));
        }
        ops.push(parsed);
    }
    Ok(ops)
}
