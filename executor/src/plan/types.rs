//! The typed plan: what a validated MSCCL++ execution plan holds (ranks, their channels and
//! buffers, threadblocks, operations), with the JSON spellings of its enumerations. Nothing here
//! reads JSON beyond those spellings; the decoder (`decode`) builds these values and checks them
//! as it goes, so a value of these types always describes a consistent plan.

use std::fmt;

use mscclpp_hal::ReduceOp;

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
    pub(super) fn parse(s: &str) -> Option<Self> {
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
    pub(super) fn parse(s: &str) -> Option<Self> {
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

            pub(super) fn parse(s: &str) -> Option<Self> {
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
    pub(super) fn needs_channel_ids(self) -> bool {
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

impl Plan {
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
