//! The plan reader: MSCCL++ JSON execution plans (what `mscclpp.language` emits) decoded into
//! typed structs and validated, with errors that name the field by its path
//! (`gpus[1].threadblocks[0].ops[3].src_buff[1].index`).
//!
//! A plan is untrusted input (a file a user points us at): decoding never panics, the input is
//! bounded in bytes (so every vector it produces is bounded too), nesting is bounded by
//! `serde_json`'s recursion limit, and every count the executor turns into device records is
//! checked against the limits below.

use std::fmt;

use mscclpp_hal::{Error, ReduceOp, Result};
use serde_json::{Map, Value};

/// Largest plan accepted, in bytes (the DSL's largest single-node plans are a few hundred KiB).
pub const MAX_PLAN_BYTES: usize = 64 << 20;
/// Most ranks a plan may describe.
pub const MAX_GPUS: usize = 256;
/// Most threadblocks per rank.
pub const MAX_THREADBLOCKS: usize = 1024;
/// Most operations per threadblock (pipeline bodies included).
pub const MAX_OPS: usize = 1 << 16;
/// Most buffer references on either side of one operation (MSCCL++: 2 local + 8 through channels).
pub const MAX_BUFFERS_PER_OP: usize = 10;
/// Most channels (or semaphores) one operation names.
pub const MAX_IDS_PER_OP: usize = 16;
/// Most channels of one type, remote buffers, or semaphores per rank (device indexes are bytes).
pub const MAX_PER_RANK: usize = 255;
/// Most device barriers (`barrier_id` below this).
pub const MAX_BARRIERS: u32 = 16;
/// Most chunks a buffer may be cut into.
pub const MAX_CHUNKS: u64 = 1 << 24;

/// Which buffer of a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferType {
    /// The send buffer (`"i"`).
    Input = 0,
    /// The receive buffer (`"o"`).
    Output = 1,
    /// The executor's scratch buffer (`"s"`).
    Scratch = 2,
}

impl BufferType {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "i" => Some(BufferType::Input),
            "o" => Some(BufferType::Output),
            "s" => Some(BufferType::Scratch),
            _ => None,
        }
    }

    /// The plan's spelling.
    pub fn name(self) -> &'static str {
        match self {
            BufferType::Input => "i",
            BufferType::Output => "o",
            BufferType::Scratch => "s",
        }
    }
}

/// How a channel moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChannelType {
    /// Peer memory mapped here; the device copies (`"memory"`).
    Memory,
    /// Through the host proxy (`"port"`).
    Port,
    /// Multicast (NVLS; `"switch"`).
    Switch,
}

impl ChannelType {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "memory" => Some(ChannelType::Memory),
            "port" => Some(ChannelType::Port),
            "switch" => Some(ChannelType::Switch),
            _ => None,
        }
    }

    /// The plan's spelling.
    pub fn name(self) -> &'static str {
        match self {
            ChannelType::Memory => "memory",
            ChannelType::Port => "port",
            ChannelType::Switch => "switch",
        }
    }
}

/// Simple (plain stores and semaphores) or LL (packets carrying a flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `"Simple"`.
    Simple,
    /// `"LL"`: LL16 packets in scratch, which is twice the data it carries.
    Ll,
}

macro_rules! op_kinds {
    ($($variant:ident = $name:literal, $code:literal;)*) => {
        /// An operation of a plan, by its JSON name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum OpKind { $(#[doc = concat!("`", $name, "`")] $variant = $code,)* }

        impl OpKind {
            /// Every operation.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$variant,)*];

            /// Its JSON name.
            pub fn name(self) -> &'static str {
                match self { $(OpKind::$variant => $name,)* }
            }

            /// Its device code (the `code` of a flattened op).
            pub fn code(self) -> u8 {
                self as u8
            }

            /// The operation of a device code.
            pub fn from_code(code: u8) -> Option<Self> {
                match code { $($code => Some(OpKind::$variant),)* _ => None }
            }

            fn parse(s: &str) -> Option<Self> {
                match s { $($name => Some(OpKind::$variant),)* _ => None }
            }
        }
    };
}

op_kinds! {
    Nop = "nop", 0;
    Barrier = "barrier", 1;
    Put = "put", 2;
    PutPackets = "ppkt", 3;
    ReadPutPackets = "rppkt", 4;
    PutWithSignal = "pws", 5;
    PutWithSignalAndFlush = "pwsf", 6;
    Get = "get", 7;
    Copy = "copy", 8;
    CopyPackets = "cpkt", 9;
    UnpackPackets = "upkt", 10;
    Signal = "signal", 11;
    Wait = "wait", 12;
    Flush = "flush", 13;
    Reduce = "re", 14;
    ReducePackets = "repkt", 15;
    ReduceCopyPackets = "recpkt", 16;
    ReduceSend = "res", 17;
    ReduceSendPackets = "respkt", 18;
    ReduceCopySendPackets = "recspkt", 19;
    ReadReduce = "rre", 20;
    ReadReduceSend = "rres", 21;
    MultiLoadReduceStore = "glres", 22;
    RelaxedSignal = "rlxsignal", 23;
    RelaxedWait = "rlxwait", 24;
    Pipeline = "pipeline", 25;
    SemRelease = "sem_release", 26;
    SemAcquire = "sem_acquire", 27;
    MultiStore = "gstore", 28;
    MultiStorePackets = "gstorepkt", 29;
}

impl OpKind {
    /// Whether the operation needs multicast (NVLS).
    pub fn is_multicast(self) -> bool {
        matches!(
            self,
            OpKind::MultiLoadReduceStore | OpKind::MultiStore | OpKind::MultiStorePackets
        )
    }

    /// Whether the op names channels (`channel_ids`) that it signals, waits or flushes on.
    fn needs_channel_ids(self) -> bool {
        matches!(
            self,
            OpKind::Signal
                | OpKind::Wait
                | OpKind::RelaxedSignal
                | OpKind::RelaxedWait
                | OpKind::Flush
        )
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One side of an operation: a range of chunks of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufRef {
    /// Where the chunks lie.
    pub target: Target,
    /// First chunk.
    pub index: u64,
    /// Number of chunks.
    pub size: u64,
}

/// Which buffer a [`BufRef`] points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A buffer of this rank.
    Local(BufferType),
    /// A peer's buffer: an index into the threadblock's remote buffers of the op's channel type,
    /// resolved to the rank's remote buffer `remote` of type `buffer` owned by `rank`.
    Remote {
        /// `buffer_id` as the plan writes it.
        id: usize,
        /// The rank's remote buffer (index into [`Gpu::remote_buffers`]).
        remote: usize,
        /// Its owner.
        rank: usize,
        /// Its type.
        buffer: BufferType,
    },
    /// A switch channel of the threadblock (`switch_channel_id`), resolved to the rank's
    /// switch channel `channel`.
    Switch {
        /// `switch_channel_id`.
        id: usize,
        /// Index into the rank's switch channels.
        channel: usize,
    },
}

/// A pipeline: its body runs `ceil(num_chunks * chunk / unit_size)` times on `unit_size` slices.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineInfo {
    /// Bytes per iteration.
    pub unit_size: u64,
    /// Chunks the pipeline covers.
    pub num_chunks: u64,
    /// The body.
    pub ops: Vec<Op>,
}

/// One operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    /// What it does.
    pub kind: OpKind,
    /// The channel type it goes through, if any.
    pub channel_type: Option<ChannelType>,
    /// Channels, resolved to indexes into the rank's channels of `channel_type`.
    pub channels: Vec<usize>,
    /// Sources.
    pub src: Vec<BufRef>,
    /// Destinations.
    pub dst: Vec<BufRef>,
    /// `reduce_op` (sum where the plan gives none).
    pub reduce: ReduceOp,
    /// `barrier_id`, `num_threadblocks`.
    pub barrier: Option<(u32, u32)>,
    /// `semaphore_ids`.
    pub semaphores: Vec<usize>,
    /// `tbg_info`: (`tb_id`, `tbg_size`): this block's slice of the op's ranges.
    pub tbg: Option<(u32, u32)>,
    /// `iter_context` and `ops` of a pipeline.
    pub pipeline: Option<PipelineInfo>,
}

/// A channel declared by a rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelDef {
    /// One memory channel per peer in `connected_to`.
    Memory(Vec<usize>),
    /// One port channel per peer in `connected_to`.
    Port(Vec<usize>),
    /// One switch channel per rank group, over buffer `buffer`.
    Switch {
        /// The multicast buffer.
        buffer: BufferType,
        /// `rank_groups`: (chunks, ranks).
        groups: Vec<(u64, Vec<usize>)>,
    },
}

/// A peer's buffer this rank accesses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteBuffer {
    /// Its owner.
    pub rank: usize,
    /// Which of its buffers.
    pub buffer: BufferType,
    /// Through which channel types.
    pub access: Vec<ChannelType>,
}

/// A threadblock.
#[derive(Debug, Clone, PartialEq)]
pub struct Threadblock {
    /// Its operations in order.
    pub ops: Vec<Op>,
    /// Its memory / port / switch channels: indexes into the rank's channels of that type.
    pub memory_channels: Vec<usize>,
    /// See `memory_channels`.
    pub port_channels: Vec<usize>,
    /// See `memory_channels`.
    pub switch_channels: Vec<usize>,
    /// Remote buffers reached through memory channels (indexes into the rank's remote buffers).
    pub memory_buffers: Vec<usize>,
    /// Remote buffers reached through port channels.
    pub port_buffers: Vec<usize>,
}

/// One rank's part of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    /// Chunks of the input, output and scratch buffers.
    pub input_chunks: u64,
    /// See `input_chunks`.
    pub output_chunks: u64,
    /// See `input_chunks`.
    pub scratch_chunks: u64,
    /// Channels as declared.
    pub channels: Vec<ChannelDef>,
    /// Peers' buffers accessed.
    pub remote_buffers: Vec<RemoteBuffer>,
    /// Initial values of the device semaphores.
    pub semaphores: Vec<u32>,
    /// Threadblocks by id.
    pub threadblocks: Vec<Threadblock>,
}

impl Gpu {
    /// Peers of its channels of type `ty`, flattened: channel `i` of that type goes to peer
    /// `peers(ty)[i]`.
    pub fn peers(&self, ty: ChannelType) -> Vec<usize> {
        self.channels
            .iter()
            .flat_map(|c| match (c, ty) {
                (ChannelDef::Memory(p), ChannelType::Memory)
                | (ChannelDef::Port(p), ChannelType::Port) => p.clone(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// Its switch channels, flattened: (buffer, chunks, ranks).
    pub fn switch_channels(&self) -> Vec<(BufferType, u64, Vec<usize>)> {
        self.channels
            .iter()
            .flat_map(|c| match c {
                ChannelDef::Switch { buffer, groups } => groups
                    .iter()
                    .map(|(n, r)| (*buffer, *n, r.clone()))
                    .collect(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// Chunks of buffer `b`.
    pub fn chunks(&self, b: BufferType) -> u64 {
        match b {
            BufferType::Input => self.input_chunks,
            BufferType::Output => self.output_chunks,
            BufferType::Scratch => self.scratch_chunks,
        }
    }
}

/// A validated execution plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// `name`: what plans are cached by.
    pub name: String,
    /// `collective` (`allreduce`, `allgather`, ...).
    pub collective: String,
    /// `protocol`.
    pub protocol: Protocol,
    /// `inplace`.
    pub inplace: bool,
    /// `reuse_resources`.
    pub reuse_resources: bool,
    /// `num_threads_per_block`.
    pub threads_per_block: u32,
    /// `use_double_scratch_buffer`.
    pub double_scratch: bool,
    /// `buffer_alignment`: chunk boundaries are multiples of it.
    pub alignment: u64,
    /// `min_message_size`, `max_message_size`.
    pub min_message_size: u64,
    /// See `min_message_size`.
    pub max_message_size: u64,
    /// One per rank, by rank.
    pub gpus: Vec<Gpu>,
}

/// Where in the plan a value is: a JSON path for error messages.
#[derive(Clone)]
struct Path(String);

impl Path {
    fn key(&self, k: &str) -> Path {
        if self.0.is_empty() {
            Path(k.to_owned())
        } else {
            Path(format!("{}.{k}", self.0))
        }
    }
    fn at(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("(the plan)")
        } else {
            f.write_str(&self.0)
        }
    }
}

fn bad(path: &Path, why: impl fmt::Display) -> Error {
    Error::invalid(format!("execution plan field {path}: {why}"))
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn object<'a>(v: &'a Value, path: &Path) -> Result<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| bad(path, format!("expected an object, found {}", kind_of(v))))
}

fn get<'a>(o: &'a Map<String, Value>, k: &str, path: &Path) -> Result<&'a Value> {
    o.get(k)
        .ok_or_else(|| bad(&path.key(k), "missing (a required field)"))
}

fn as_u64(v: &Value, path: &Path) -> Result<u64> {
    v.as_u64()
        .ok_or_else(|| bad(path, format!("expected a non-negative integer, found {v}")))
}

fn u64_field(o: &Map<String, Value>, k: &str, path: &Path) -> Result<u64> {
    as_u64(get(o, k, path)?, &path.key(k))
}

fn u64_or(o: &Map<String, Value>, k: &str, default: u64, path: &Path) -> Result<u64> {
    o.get(k).map_or(Ok(default), |v| as_u64(v, &path.key(k)))
}

fn index_field(o: &Map<String, Value>, k: &str, path: &Path) -> Result<usize> {
    let v = u64_field(o, k, path)?;
    usize::try_from(v).map_err(|_| bad(&path.key(k), format!("{v} is too large")))
}

fn bool_field(o: &Map<String, Value>, k: &str, default: Option<bool>, path: &Path) -> Result<bool> {
    match (o.get(k), default) {
        (None, Some(d)) => Ok(d),
        (None, None) => Err(bad(&path.key(k), "missing (a required field)")),
        (Some(v), _) => v.as_bool().ok_or_else(|| {
            bad(
                &path.key(k),
                format!("expected a boolean, found {}", kind_of(v)),
            )
        }),
    }
}

fn str_field<'a>(o: &'a Map<String, Value>, k: &str, path: &Path) -> Result<&'a str> {
    let v = get(o, k, path)?;
    v.as_str().ok_or_else(|| {
        bad(
            &path.key(k),
            format!("expected a string, found {}", kind_of(v)),
        )
    })
}

fn array<'a>(v: &'a Value, path: &Path, max: usize) -> Result<&'a [Value]> {
    let a = v
        .as_array()
        .ok_or_else(|| bad(path, format!("expected an array, found {}", kind_of(v))))?;
    if a.len() > max {
        return Err(bad(
            path,
            format!(
                "{} entries, more than the {max} this executor accepts",
                a.len()
            ),
        ));
    }
    Ok(a)
}

fn array_or_empty<'a>(
    o: &'a Map<String, Value>,
    k: &str,
    path: &Path,
    max: usize,
) -> Result<&'a [Value]> {
    match o.get(k) {
        None => Ok(&[]),
        Some(v) => array(v, &path.key(k), max),
    }
}

fn indexes(v: &Value, path: &Path, max: usize) -> Result<Vec<usize>> {
    array(v, path, max)?
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let n = as_u64(x, &path.at(i))?;
            usize::try_from(n).map_err(|_| bad(&path.at(i), format!("{n} is too large")))
        })
        .collect()
}

fn buffer_type(s: &str, path: &Path) -> Result<BufferType> {
    BufferType::parse(s).ok_or_else(|| {
        bad(
            path,
            format!("unknown buffer type {s:?} (expected \"i\", \"o\" or \"s\")"),
        )
    })
}

fn channel_type(s: &str, path: &Path) -> Result<ChannelType> {
    ChannelType::parse(s).ok_or_else(|| {
        bad(
            path,
            format!("unknown channel type {s:?} (expected \"memory\", \"port\" or \"switch\")"),
        )
    })
}

impl Plan {
    /// Decodes and validates a plan for a communicator of `nranks` ranks.
    pub fn from_bytes(bytes: &[u8], nranks: usize) -> Result<Plan> {
        if bytes.len() > MAX_PLAN_BYTES {
            return Err(Error::invalid(format!(
                "execution plan of {} bytes: at most {MAX_PLAN_BYTES} are accepted",
                bytes.len()
            )));
        }
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::invalid(format!("execution plan is not valid JSON: {e}")))?;
        Plan::from_value(&v, nranks)
    }

    /// Reads, decodes and validates the plan in file `path`.
    pub fn from_file(path: &std::path::Path, nranks: usize) -> Result<Plan> {
        let meta = std::fs::metadata(path)
            .map_err(|e| Error::io(format!("reading execution plan {}", path.display()), e))?;
        if meta.len() > MAX_PLAN_BYTES as u64 {
            return Err(Error::invalid(format!(
                "execution plan {} has {} bytes: at most {MAX_PLAN_BYTES} are accepted",
                path.display(),
                meta.len()
            )));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io(format!("reading execution plan {}", path.display()), e))?;
        Plan::from_bytes(&bytes, nranks)
            .map_err(|e| e.with_context(|| format!("plan file {}", path.display())))
    }

    /// Validates a decoded JSON value as a plan for `nranks` ranks.
    pub fn from_value(v: &Value, nranks: usize) -> Result<Plan> {
        let root = Path(String::new());
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
        if alignment == 0 || alignment > 1 << 20 || alignment % 4 != 0 {
            return Err(bad(
                &root.key("buffer_alignment"),
                format!("{alignment}: a multiple of 4 from 4 to 1 MiB is needed"),
            ));
        }
        let threads = u64_or(o, "num_threads_per_block", 1024, &root)?;
        if !(1..=1024).contains(&threads) {
            return Err(bad(
                &root.key("num_threads_per_block"),
                format!("{threads}: 1 to 1024 expected"),
            ));
        }
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
            gpus.push(read_gpu_decls(g, r, nranks, &gpus_path.at(r))?);
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

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.gpus.len()
    }

    /// The multicast operations of `rank`'s part, if any: the first one's path.
    pub fn first_multicast_op(&self, rank: usize) -> Option<String> {
        let g = self.gpus.get(rank)?;
        for (t, tb) in g.threadblocks.iter().enumerate() {
            for (i, op) in tb.ops.iter().enumerate() {
                let inner = op.pipeline.as_ref().map_or(&[][..], |p| &p.ops[..]);
                if op.kind.is_multicast() || inner.iter().any(|o| o.kind.is_multicast()) {
                    return Some(format!(
                        "gpus[{rank}].threadblocks[{t}].ops[{i}] ({})",
                        op.kind
                    ));
                }
            }
        }
        None
    }
}

fn read_gpu_decls(g: &Value, r: usize, nranks: usize, path: &Path) -> Result<Gpu> {
    let o = object(g, path)?;
    let id = u64_field(o, "id", path)?;
    if id != r as u64 {
        return Err(bad(
            &path.key("id"),
            format!("{id}, but entry {r} of gpus must describe rank {r}"),
        ));
    }
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
    // Both 0 is legal for plans that move no data (signal/wait tests); an op naming a chunk
    // then fails the chunk-range check below.
    let peer = |v: usize, p: &Path| -> Result<usize> {
        if v >= nranks || v == r {
            Err(bad(
                p,
                format!("peer {v} is not another rank of {nranks} (this is rank {r})"),
            ))
        } else {
            Ok(v)
        }
    };
    let ch_path = path.key("channels");
    let mut channels = Vec::new();
    for (i, c) in array_or_empty(o, "channels", path, MAX_PER_RANK)?
        .iter()
        .enumerate()
    {
        let cp = ch_path.at(i);
        let co = object(c, &cp)?;
        let ty = channel_type(str_field(co, "channel_type", &cp)?, &cp.key("channel_type"))?;
        match ty {
            ChannelType::Memory | ChannelType::Port => {
                let pp = cp.key("connected_to");
                let peers = indexes(get(co, "connected_to", &cp)?, &pp, MAX_PER_RANK)?
                    .into_iter()
                    .enumerate()
                    .map(|(j, p)| peer(p, &pp.at(j)))
                    .collect::<Result<Vec<_>>>()?;
                channels.push(if ty == ChannelType::Memory {
                    ChannelDef::Memory(peers)
                } else {
                    ChannelDef::Port(peers)
                });
            }
            ChannelType::Switch => {
                let buffer =
                    buffer_type(str_field(co, "buffer_type", &cp)?, &cp.key("buffer_type"))?;
                let gp = cp.key("rank_groups");
                let mut groups = Vec::new();
                for (j, grp) in array(get(co, "rank_groups", &cp)?, &gp, MAX_PER_RANK)?
                    .iter()
                    .enumerate()
                {
                    let jp = gp.at(j);
                    let go = object(grp, &jp)?;
                    let size = u64_field(go, "size", &jp)?;
                    let ranks = indexes(get(go, "ranks", &jp)?, &jp.key("ranks"), MAX_GPUS)?;
                    if let Some(bad_rank) = ranks.iter().find(|&&x| x >= nranks) {
                        return Err(bad(
                            &jp.key("ranks"),
                            format!("rank {bad_rank} does not exist (the plan has {nranks})"),
                        ));
                    }
                    groups.push((size, ranks));
                }
                channels.push(ChannelDef::Switch { buffer, groups });
            }
        }
    }
    let rb_path = path.key("remote_buffers");
    let mut remote_buffers = Vec::new();
    for (i, b) in array_or_empty(o, "remote_buffers", path, MAX_PER_RANK)?
        .iter()
        .enumerate()
    {
        let bp = rb_path.at(i);
        let bo = object(b, &bp)?;
        let rank = index_field(bo, "rank", &bp)?;
        let rank = peer(rank, &bp.key("rank"))?;
        let buffer = buffer_type(str_field(bo, "type", &bp)?, &bp.key("type"))?;
        let ap = bp.key("access_channel_types");
        let mut access = Vec::new();
        for (j, a) in array(get(bo, "access_channel_types", &bp)?, &ap, 4)?
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
        remote_buffers.push(RemoteBuffer {
            rank,
            buffer,
            access,
        });
    }
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
    let gpu = Gpu {
        input_chunks: chunks[0],
        output_chunks: chunks[1],
        scratch_chunks: chunks[2],
        channels,
        remote_buffers,
        semaphores,
        threadblocks: Vec::new(),
    };
    for ty in [ChannelType::Memory, ChannelType::Port] {
        let n = gpu.peers(ty).len();
        if n > MAX_PER_RANK {
            return Err(bad(
                &ch_path,
                format!("{n} {} channels, at most {MAX_PER_RANK}", ty.name()),
            ));
        }
    }
    if gpu.switch_channels().len() > MAX_PER_RANK {
        return Err(bad(
            &ch_path,
            format!("more than {MAX_PER_RANK} switch channels"),
        ));
    }
    Ok(gpu)
}

fn read_threadblocks(g: &Value, r: usize, gpus: &[Gpu], path: &Path) -> Result<Vec<Threadblock>> {
    let o = object(g, path)?;
    let gpu = &gpus[r];
    let tp = path.key("threadblocks");
    let tbs_v = array(get(o, "threadblocks", path)?, &tp, MAX_THREADBLOCKS)?;
    let mut tbs: Vec<Option<Threadblock>> = vec![None; tbs_v.len()];
    let n_mem = gpu.peers(ChannelType::Memory).len();
    let n_port = gpu.peers(ChannelType::Port).len();
    let n_switch = gpu.switch_channels().len();
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
        let cp = p.key("channels");
        for (i, c) in array_or_empty(to, "channels", &p, MAX_PER_RANK)?
            .iter()
            .enumerate()
        {
            let ip = cp.at(i);
            let co = object(c, &ip)?;
            let ty = channel_type(str_field(co, "channel_type", &ip)?, &ip.key("channel_type"))?;
            let idp = ip.key("channel_ids");
            let ids = indexes(get(co, "channel_ids", &ip)?, &idp, MAX_PER_RANK)?;
            let (list, n) = match ty {
                ChannelType::Memory => (&mut block.memory_channels, n_mem),
                ChannelType::Port => (&mut block.port_channels, n_port),
                ChannelType::Switch => (&mut block.switch_channels, n_switch),
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
        let rp = p.key("remote_buffer_refs");
        for (i, c) in array_or_empty(to, "remote_buffer_refs", &p, MAX_PER_RANK)?
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
        let op_path = p.key("ops");
        let ops_v = array(get(to, "ops", &p)?, &op_path, MAX_OPS)?;
        let mut total = 0usize;
        for (i, op) in ops_v.iter().enumerate() {
            let parsed = read_op(op, &op_path.at(i), r, gpus, &block, tbs_v.len(), true)?;
            total += 1 + parsed.pipeline.as_ref().map_or(0, |p| p.ops.len());
            if total > MAX_OPS {
                return Err(bad(&op_path, format!("more than {MAX_OPS} operations")));
            }
            block.ops.push(parsed);
        }
        tbs[id] = Some(block);
    }
    // Every id from 0 to len-1 was used exactly once (checked above), so all are filled.
    Ok(tbs.into_iter().flatten().collect())
}

fn read_op(
    v: &Value,
    path: &Path,
    r: usize,
    gpus: &[Gpu],
    tb: &Threadblock,
    n_tbs: usize,
    outer: bool,
) -> Result<Op> {
    let gpu = &gpus[r];
    let o = object(v, path)?;
    let name = str_field(o, "name", path)?;
    let kind = OpKind::parse(name).ok_or_else(|| {
        let known: Vec<&str> = OpKind::ALL.iter().map(|k| k.name()).collect();
        bad(
            &path.key("name"),
            format!("unknown operation {name:?} (known: {})", known.join(", ")),
        )
    })?;
    let channel_type = match o.get("channel_type") {
        None => None,
        Some(Value::String(s)) if s == "none" => None,
        Some(Value::String(s)) => Some(channel_type(s, &path.key("channel_type"))?),
        Some(x) => {
            return Err(bad(
                &path.key("channel_type"),
                format!("expected a string, found {}", kind_of(x)),
            ));
        }
    };
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
            op.channels.push(*ch);
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
    let (n_switch_tb, tbg) = (tb.switch_channels.len(), o.get("tbg_info"));
    for (side, out) in [("src_buff", false), ("dst_buff", true)] {
        let Some(list) = o.get(side) else { continue };
        let sp = path.key(side);
        let mut refs = Vec::new();
        for (j, b) in array(list, &sp, MAX_BUFFERS_PER_OP)?.iter().enumerate() {
            let bp = sp.at(j);
            let bo = object(b, &bp)?;
            let index = u64_field(bo, "index", &bp)?;
            let size = u64_field(bo, "size", &bp)?;
            let (target, chunks, what) = if let Some(id) = bo.get("buffer_id") {
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
                (
                    Target::Remote {
                        id,
                        remote,
                        rank: rb.rank,
                        buffer: rb.buffer,
                    },
                    gpus[rb.rank].chunks(rb.buffer),
                    format!("buffer {} of rank {}", rb.buffer.name(), rb.rank),
                )
            } else if let Some(id) = bo.get("switch_channel_id") {
                let id = as_u64(id, &bp.key("switch_channel_id"))? as usize;
                let channel = *tb.switch_channels.get(id).ok_or_else(|| {
                    bad(
                        &bp.key("switch_channel_id"),
                        format!(
                            "switch channel {id} does not exist: the threadblock has {n_switch_tb}"
                        ),
                    )
                })?;
                let (buffer, _, _) = gpu.switch_channels()[channel];
                (
                    Target::Switch { id, channel },
                    gpu.chunks(buffer),
                    format!("switch buffer {}", buffer.name()),
                )
            } else {
                let s = str_field(bo, "type", &bp)?;
                let b = buffer_type(s, &bp.key("type"))?;
                (
                    Target::Local(b),
                    gpu.chunks(b),
                    format!("buffer {}", b.name()),
                )
            };
            if index.checked_add(size).is_none_or(|end| end > chunks) {
                return Err(bad(
                    &bp.key("index"),
                    format!(
                        "chunks {index}..{} lie past the end of {what}, which has {chunks}",
                        index.saturating_add(size)
                    ),
                ));
            }
            refs.push(BufRef {
                target,
                index,
                size,
            });
        }
        if out {
            op.dst = refs;
        } else {
            op.src = refs;
        }
    }
    if let Some(rv) = o.get("reduce_op") {
        let rp = path.key("reduce_op");
        let s = rv
            .as_str()
            .ok_or_else(|| bad(&rp, format!("expected a string, found {}", kind_of(rv))))?;
        op.reduce = s.parse().map_err(|e| bad(&rp, e))?;
    }
    if kind == OpKind::Barrier {
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
        op.barrier = Some((id as u32, n as u32));
    }
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
            op.semaphores.push(id);
        }
    } else if matches!(kind, OpKind::SemAcquire | OpKind::SemRelease) {
        return Err(bad(
            &path.key("semaphore_ids"),
            "missing (a required field)",
        ));
    }
    if let Some(t) = tbg {
        let tp = path.key("tbg_info");
        let to = object(t, &tp)?;
        let id = u64_field(to, "tb_id", &tp)?;
        let size = u64_field(to, "tbg_size", &tp)?;
        if size == 0 || id >= size || size > MAX_THREADBLOCKS as u64 {
            return Err(bad(&tp, format!("tb_id {id} of tbg_size {size}")));
        }
        op.tbg = Some((id as u32, size as u32));
    }
    if kind == OpKind::Pipeline {
        if !outer {
            return Err(bad(path, "a pipeline inside a pipeline"));
        }
        let ip = path.key("iter_context");
        let io = object(get(o, "iter_context", path)?, &ip)?;
        let unit_size = u64_field(io, "unit_size", &ip)?;
        let num_chunks = u64_field(io, "num_chunks", &ip)?;
        if unit_size == 0 || num_chunks > MAX_CHUNKS {
            return Err(bad(
                &ip,
                format!(
                    "unit_size {unit_size}, num_chunks {num_chunks}: a positive unit is needed"
                ),
            ));
        }
        let bp = path.key("ops");
        let mut body = Vec::new();
        for (j, inner) in array(get(o, "ops", path)?, &bp, MAX_OPS)?
            .iter()
            .enumerate()
        {
            body.push(read_op(inner, &bp.at(j), r, gpus, tb, n_tbs, false)?);
        }
        op.pipeline = Some(PipelineInfo {
            unit_size,
            num_chunks,
            ops: body,
        });
    }
    check_shape(&op, path)?;
    Ok(op)
}

/// Checks that the sources and destinations of `op` have the shape its semantics need.
fn check_shape(op: &Op, path: &Path) -> Result<()> {
    use OpKind as K;
    let local = |b: &BufRef| matches!(b.target, Target::Local(_));
    let remote = |b: &BufRef| matches!(b.target, Target::Remote { .. });
    let switch = |b: &BufRef| matches!(b.target, Target::Switch { .. });
    let need = |ok: bool, why: &str| -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(bad(path, format!("{}: {why}", op.kind)))
        }
    };
    let (s, d) = (&op.src, &op.dst);
    let first_local = |v: &Vec<BufRef>| v.first().is_some_and(local);
    let ch = op.channel_type;
    match op.kind {
        K::Nop
        | K::Barrier
        | K::Signal
        | K::Wait
        | K::RelaxedSignal
        | K::RelaxedWait
        | K::Flush
        | K::SemAcquire
        | K::SemRelease
        | K::Pipeline => Ok(()),
        K::Copy | K::CopyPackets | K::UnpackPackets => need(
            s.len() == 1 && d.len() == 1 && local(&s[0]) && local(&d[0]),
            "one local source and one local destination expected",
        ),
        K::Put | K::PutWithSignal | K::PutWithSignalAndFlush | K::PutPackets => {
            need(
                !d.is_empty() && d.iter().all(remote) && s.iter().all(local) && !s.is_empty(),
                "local sources and remote destinations expected",
            )?;
            need(
                ch != Some(ChannelType::Switch) && ch.is_some(),
                "a memory or port channel_type expected",
            )?;
            if ch == Some(ChannelType::Port) {
                need(
                    op.channels.len() == d.len() && s.len() == d.len(),
                    "one channel and one source per destination expected through port channels",
                )?;
            }
            need(
                s.len() == d.len() || s.len() == 1,
                "one source per destination (or one source) expected",
            )
        }
        K::ReadPutPackets => need(
            s.len() == 1 && local(&s[0]) && !d.is_empty() && d.iter().all(remote),
            "one local source and remote destinations expected",
        ),
        K::Get => need(
            !s.is_empty() && s.len() == d.len() && s.iter().all(remote) && d.iter().all(local),
            "remote sources and as many local destinations expected",
        ),
        K::Reduce | K::ReducePackets => need(
            s.len() >= 2 && s.iter().all(local) && d.len() == 1 && local(&d[0]),
            "local sources (at least 2) and one local destination expected",
        ),
        K::ReduceSend | K::ReduceSendPackets => need(
            s.len() >= 2 && s.iter().all(local) && first_local(d) && d[1..].iter().all(remote),
            "local sources, a local destination and remote destinations expected",
        ),
        K::ReduceCopyPackets => need(
            s.len() >= 2 && s.iter().all(local) && d.len() == 2 && d.iter().all(local),
            "local sources, a local destination and a local packet copy expected",
        ),
        K::ReduceCopySendPackets => need(
            s.len() >= 2
                && s.iter().all(local)
                && d.len() >= 2
                && local(&d[0])
                && local(&d[1])
                && d[2..].iter().all(remote),
            "local sources, a local destination, a local packet copy and remote destinations expected",
        ),
        K::ReadReduce | K::ReadReduceSend => need(
            first_local(s)
                && s.len() >= 2
                && s[1..].iter().all(remote)
                && first_local(d)
                && (op.kind == K::ReadReduceSend || d.len() == 1)
                && d[1..].iter().all(remote),
            "a local source, remote sources, a local destination (and remote destinations) expected",
        ),
        K::MultiLoadReduceStore => need(
            s.len() == 1 && d.len() == 1 && switch(&s[0]) && switch(&d[0]),
            "a switch source and a switch destination expected",
        ),
        K::MultiStore | K::MultiStorePackets => need(
            s.len() == 1 && d.len() == 1 && local(&s[0]) && switch(&d[0]),
            "a local source and a switch destination expected",
        ),
    }
}
