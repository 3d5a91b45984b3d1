//! A communicator's collectives: scratch buffers mapped by every peer, the flag counter, the
//! kernel, and argument checking.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use mscclpp_comm::Communicator;
use mscclpp_hal::collective::{
    DirectCollectiveArgs, LL_STATE_BYTES, LL128_LINE_BYTES, LL128_LINE_DATA_BYTES, MAX_RANKS,
    MAX_WINDOWS, ReadCollectiveArgs, WINDOW_TABLE_BYTES, read_key,
};
use mscclpp_hal::{
    BufferSlice, CollectiveKind, DataType, DeviceBuffer, DeviceInfo, Error, Kernel, KernelArgs,
    KernelId, LaunchConfig, LlCollectiveArgs, MemoryKind, ReduceOp, Result, Stream,
};
use mscclpp_transports::{RegisteredMemory, Transport, TransportFlags};

/// Packet bytes of one scratch slot: 2 MiB of packets carry 1 MiB of data per peer per round (so an
/// LL all-reduce up to 1 MiB takes one round).
pub const DEFAULT_SLOT_BYTES: u64 = 2 << 20;

/// Which algorithm serves a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// LL packets through scratch (every collective, best for small messages).
    Ll,
    /// LL128 lines through the same scratch: 120 data bytes per 128 instead of 8 per 16
    /// (all-reduce of one round, on devices with `Capabilities::ll128`).
    Ll128,
    /// Plain stores into the peers' scratch, pipelined (every collective; best for large
    /// messages).
    Direct,
    /// Every rank reads the peers' inputs where they lie — registered windows, or a staging
    /// copy — and reduces locally (all-reduce; mid-size messages).
    Read,
}

/// Per-collective choice: a forced algorithm, or by size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Auto,
    Forced(Algorithm),
}

/// Rank-block bytes from which the direct algorithm serves each collective when not forced
/// (measured on 2 x H200, graph-timed: LL 11.0 µs vs direct 12.2 µs for a 1 MiB all-reduce;
/// direct wins from 4 MiB on; all-gather/reduce-scatter switch where LL stopped beating NCCL).
fn direct_threshold(kind: CollectiveKind) -> u64 {
    match kind {
        CollectiveKind::AllReduce | CollectiveKind::AllGather | CollectiveKind::ReduceScatter => {
            2 << 20
        }
        // Measured: broadcast direct 7.8 µs vs LL 10.3 at 1 MiB, 6.6 vs 7.1 at 512 KiB, LL ahead
        // at 256 KiB; all-to-all (2 ranks) direct ahead from 1 MiB blocks (8.4 vs 10.0 µs).
        CollectiveKind::Broadcast => 512 << 10,
        CollectiveKind::AllToAll => 1 << 20,
    }
}

/// All-reduce bytes LL128 lines serve when not forced (where the device can, and in one round:
/// up to 1.875 MiB with the default slots). Measured on 2 x H200 (bf16, graph-timed, LL / LL128
/// µs): 64 KiB 3.13 / 3.70, 128 KiB 3.50 / 3.71, 256 KiB 4.38 / 4.18, 512 KiB 5.81 / 5.06, 1 MiB
/// 8.81 / 7.66 — LL128's per-line agreement costs latency, its 94 % payload wins from 256 KiB.
fn ll128_range() -> std::ops::Range<u64> {
    (256 << 10)..(2 << 20)
}

/// Writes window `w`'s row of a window table: every rank's address and length.
fn write_window_row(
    stream: &dyn Stream,
    table: &DeviceBuffer,
    w: usize,
    bases: &[u64; MAX_RANKS],
    lens: &[u64; MAX_RANKS],
) -> Result<()> {
    let row = 8 * MAX_RANKS;
    for (at, words) in [(w * row, bases), ((MAX_WINDOWS + w) * row, lens)] {
        stream.write_from_host(&table.slice(at..at + row)?, &words_bytes(words))?;
    }
    Ok(())
}

/// `words` as native-endian bytes (what a device reads back as `u64`s).
fn words_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

fn env_choice(kind: CollectiveKind) -> Result<Choice> {
    let var = format!("MSCCLPP_ALGO_{}", kind.name().to_ascii_uppercase());
    let choice = match mscclpp_hal::env::get(&var).map(|v| v.to_ascii_lowercase()) {
        None => Choice::Auto,
        Some(v) if v == "auto" => Choice::Auto,
        Some(v) if v == "ll" => Choice::Forced(Algorithm::Ll),
        Some(v) if v == "direct" => Choice::Forced(Algorithm::Direct),
        Some(v) if v == "read" && kind == CollectiveKind::AllReduce => {
            Choice::Forced(Algorithm::Read)
        }
        Some(v) if v == "ll128" && kind == CollectiveKind::AllReduce => {
            Choice::Forced(Algorithm::Ll128)
        }
        Some(v) => {
            return Err(Error::invalid(format!(
                "environment variable {var}={v:?} is malformed: expected auto, ll or direct{}",
                if kind == CollectiveKind::AllReduce {
                    " (or ll128, read)"
                } else {
                    ""
                }
            )));
        }
    };
    Ok(choice)
}

/// The direct algorithm's scratch, mapped by every peer.
#[derive(Debug)]
struct Direct {
    scratch: Scratch,
    slot_bytes: u64,
    max_blocks: u32,
    /// Threads per block of calls whose larger buffer exceeds [`DIRECT_SMALL_BYTES`].
    threads: u32,
    /// Threads per block up to [`DIRECT_SMALL_BYTES`] (the larger buffer).
    small_threads: u32,
    kernel: Arc<dyn Kernel>,
}

/// Direct calls whose larger buffer (input or output, per rank) holds at most this many bytes
/// launch blocks of [`DIRECT_SMALL_THREADS`] (unless `MSCCLPP_DIRECT_THREADS` says otherwise):
/// on 2 x H200 an all-reduce with 512 threads took 14.03 / 20.28 / 32.84 µs at 2 / 4 / 8 MiB
/// against 15.06 / 20.96 / 33.43 with 896 (run41), and every collective up to 8 MiB of buffer
/// was as fast or faster with 512 (run43, run44); 896 were faster for reduce-scatter and
/// all-to-all of 16 MiB (8 MiB rank blocks: 34.25 against 35.64 µs, 33.87 against 35.83) and
/// serve the large sizes (1 GiB busbw). Only the blocks and chunks must match across ranks, so
/// the threads may differ per call.
const DIRECT_SMALL_BYTES: u64 = 8 << 20;
const DIRECT_SMALL_THREADS: u32 = 512;

/// A buffer registered with every rank's collectives (see [`Collectives::register`]): its index
/// in the window tables, the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window(usize);

impl Window {
    /// The index in the window tables (1 or more; 0 is the staging area).
    pub fn index(self) -> usize {
        self.0
    }
}

/// A registered buffer: kept alive, with the peers' buffers mapped here, until deregistered.
#[derive(Debug)]
struct WindowEntry {
    slice: BufferSlice,
    _peers: Vec<RegisteredMemory>,
}

/// The read algorithm's scratch, window table and registered windows.
#[derive(Debug)]
struct Read {
    scratch: Scratch,
    table: DeviceBuffer,
    staging_bytes: u64,
    max_blocks: u32,
    threads: u32,
    kernel: Arc<dyn Kernel>,
    windows: Mutex<Vec<Option<WindowEntry>>>,
}

impl Read {
    /// Blocks of a call of `bytes` per rank, `None` when the staging area or the grid cannot
    /// hold it (the host's one worker holds what the staging area does).
    fn blocks(&self, bytes: u64) -> Option<u32> {
        if bytes > self.staging_bytes {
            None
        } else if self.threads == 1 {
            Some(1)
        } else {
            ReadCollectiveArgs::grid(bytes, self.threads, self.max_blocks)
        }
    }
}

/// The collectives of one communicator (all ranks create it together).
#[derive(Debug)]
pub struct Collectives {
    comm: Arc<Communicator>,
    scratch: Scratch,
    flag: DeviceBuffer,
    slot_bytes: u64,
    /// The LL kernels: copying collectives, and reducing ones by `dtype * 5 + op`.
    ll_copy: Arc<dyn Kernel>,
    ll_reduce: Vec<Arc<dyn Kernel>>,
    /// The short kernels (one round, a thread per packet of a rank block): all-reduce and
    /// reduce-scatter indexed as `ll_reduce`, all-gather and all-to-all.
    ll_short_allreduce: Vec<Arc<dyn Kernel>>,
    ll_short_reduce_scatter: Vec<Arc<dyn Kernel>>,
    ll_short_allgather: Arc<dyn Kernel>,
    ll_short_alltoall: Arc<dyn Kernel>,
    /// The LL128 all-reduce and its block size, where every rank can use it.
    ll128: Option<(Arc<dyn Kernel>, u32)>,
    /// Bytes an LL128 call carries at most (one round).
    ll128_round_bytes: u64,
    direct: Option<Direct>,
    read: Option<Read>,
    choices: [Choice; 5],
    /// `MSCCLPP_LL_THREADS`, when given: the grid keeps that block size.
    ll_threads: Option<u32>,
    ll_packets_per_block: u64,
    /// Whether one-round calls may take the short kernels (`MSCCLPP_LL_SHORT`,
    /// [`Collectives::use_short_kernels`]); per rank, ranks may differ.
    short: AtomicBool,
}

/// The most threads (whole warps) a block of `kernel` may have on this device.
fn thread_limit(info: &DeviceInfo, kernel: &dyn Kernel) -> u32 {
    let limit = kernel
        .max_threads_per_block()
        .unwrap_or(info.max_threads_per_block)
        .min(info.max_threads_per_block);
    (limit / 32 * 32).max(32)
}

/// Blocks and threads of a grid whose blocks wait for the peers' blocks: GPUs at most one block
/// per SM (128 at most; all resident) of `threads`; the host one worker.
fn resident_grid(info: &DeviceInfo, threads: u32) -> (u32, u32) {
    if info.warp_size == 1 {
        (1, 1)
    } else {
        (info.multiprocessors.clamp(1, 128), threads)
    }
}

/// Checks that every rank has the same `value` of `what`: kernels whose blocks wait for the
/// peers' blocks need the same algorithms and grids everywhere, and a difference would hang them.
/// Every rank gets the error, which names a rank that differs.
fn agree(comm: &Communicator, what: &str, value: String) -> Result<()> {
    let all = comm.bootstrap().all_gather(value.as_bytes())?;
    match all.iter().position(|v| v.as_slice() != value.as_bytes()) {
        None => Ok(()),
        Some(p) => Err(Error::invalid(format!(
            "{what} differ between ranks: rank {} has {value}, rank {p} has {}; every rank must run with the same environment and the same GPU model",
            comm.rank(),
            String::from_utf8_lossy(&all[p])
        ))),
    }
}

/// A buffer of this rank that every peer maps, and the peers' buffers mapped here.
#[derive(Debug)]
struct PeerMaps {
    /// Kept alive: the mappings of the peers' buffers.
    peers: Vec<RegisteredMemory>,
    /// Every rank's buffer as seen here (this rank's own at index `rank`), and its length.
    bases: [u64; MAX_RANKS],
    lens: [u64; MAX_RANKS],
}

/// Registers `slice` (this rank's `what`) and maps every peer's (a collective call).
fn map_peers(comm: &Communicator, slice: &BufferSlice, what: &str) -> Result<PeerMaps> {
    let (rank, n) = (comm.rank(), comm.nranks());
    let mine = comm.register_memory(slice, TransportFlags::single(Transport::CudaIpc))?;
    let mut maps = PeerMaps {
        peers: Vec::with_capacity(n - 1),
        bases: [0; MAX_RANKS],
        lens: [0; MAX_RANKS],
    };
    maps.bases[rank] = slice.ptr().0;
    maps.lens[rank] = slice.len() as u64;
    for p in (0..n).filter(|&p| p != rank) {
        let theirs = comm.exchange_memory(&mine, p)?;
        let view = theirs.mapped_slice().ok_or_else(|| {
            Error::invalid(format!(
                "rank {p}'s {what} is not mapped on rank {rank}: collectives need every rank on one host (CudaIpc)"
            ))
        })?;
        maps.bases[p] = view.ptr().0;
        maps.lens[p] = view.len() as u64;
        maps.peers.push(theirs);
    }
    Ok(maps)
}

/// A scratch buffer of this rank, zeroed, and every rank's scratch mapped here.
#[derive(Debug)]
struct Scratch {
    _buffer: DeviceBuffer,
    _peers: Vec<RegisteredMemory>,
    /// Every rank's scratch (this rank's own at index `rank`).
    addrs: [u64; MAX_RANKS],
}

/// Allocates, zeroes and registers a scratch buffer of `bytes` and maps every peer's (a
/// collective call; `bytes` must be the same on every rank).
fn exchange_scratch(comm: &Communicator, bytes: u64, what: &str) -> Result<Scratch> {
    let bytes = usize::try_from(bytes)
        .map_err(|_| Error::invalid(format!("{what} of {bytes} bytes does not fit this host")))?;
    let device = comm.device();
    let buffer = device.alloc(bytes, MemoryKind::Device)?;
    let stream = device.create_stream()?;
    // Zeroed before anyone can see it: flags and packets of 0 never match.
    stream.fill(&buffer.full(), 0)?;
    stream.synchronize()?;
    let maps = map_peers(comm, &buffer.full(), what)?;
    if let Some(p) = (0..comm.nranks()).find(|&p| maps.lens[p] != bytes as u64) {
        return Err(Error::Remote {
            rank: p,
            message: format!("{what} of {} bytes, expected {bytes}", maps.lens[p]),
        });
    }
    Ok(Scratch {
        _buffer: buffer,
        _peers: maps.peers,
        addrs: maps.bases,
    })
}

/// The kernel `id`, or `None` where the backend lacks it — then every rank must lack it too
/// (`what` names the settings agreed).
fn optional_kernel(
    comm: &Communicator,
    id: KernelId,
    what: &str,
) -> Result<Option<Arc<dyn Kernel>>> {
    match comm.device().load_kernel(id) {
        Ok(k) => Ok(Some(k)),
        Err(e) => {
            tracing::info!("{id} unavailable: {e}");
            agree(comm, what, "unavailable".into())?;
            Ok(None)
        }
    }
}

/// Threads per block: `forced` (from the environment) or `default`, from 32 to 1024 and within
/// what `kernel` may launch with on this device.
fn block_threads(info: &DeviceInfo, kernel: &dyn Kernel, forced: Option<u32>, default: u32) -> u32 {
    let limit = thread_limit(info, kernel);
    let threads = forced.unwrap_or(default).clamp(32, 1024);
    if threads > limit {
        tracing::info!(
            kernel = %kernel.id(),
            threads,
            limit,
            "fewer threads per block than asked: the kernel's limit on this device"
        );
    }
    threads.min(limit)
}

impl Collectives {
    /// Sets up the collectives of `comm` (a collective call: every rank makes it).
    pub fn new(comm: Arc<Communicator>) -> Result<Self> {
        Self::with_slot_bytes(comm, DEFAULT_SLOT_BYTES)
    }

    /// As [`Collectives::new`] with a chosen slot size (tests use small slots to exercise
    /// messages that take many rounds).
    pub fn with_slot_bytes(comm: Arc<Communicator>, slot_bytes: u64) -> Result<Self> {
        let (rank, n) = (comm.rank(), comm.nranks());
        if !(2..=MAX_RANKS).contains(&n) {
            return Err(Error::invalid(format!(
                "collectives serve 2 to {MAX_RANKS} ranks of one node; this communicator has {n}"
            )));
        }
        if slot_bytes < 16 || slot_bytes % 16 != 0 {
            return Err(Error::invalid(format!(
                "slot of {slot_bytes} bytes: a positive multiple of 16 is needed"
            )));
        }
        let device = comm.device().clone();
        let mut choices = [Choice::Auto; 5];
        for kind in CollectiveKind::ALL {
            choices[kind as usize] = env_choice(kind)?;
        }
        let ll_threads = mscclpp_hal::env::parse::<u32>("MSCCLPP_LL_THREADS", "threads per block")?
            .map(|t| t.clamp(32, 1024));
        // 256 packets (4 KiB of data) per block: on 2 x H200 most LL calls from 4 KiB to 256 KiB
        // were 0.05-0.5 µs faster than with 512 (all-gather, reduce-scatter, broadcast and
        // all-to-all at 4-64 KiB), none slower beyond the noise of ~0.1 µs (run40).
        let ll_packets_per_block =
            mscclpp_hal::env::parse::<u64>("MSCCLPP_LL_PACKETS_PER_BLOCK", "a packet count")?
                .unwrap_or(256)
                .max(1);
        // Not agreed across ranks: the short and general kernels run the same protocol.
        let short = mscclpp_hal::env::flag("MSCCLPP_LL_SHORT")?.unwrap_or(true);
        agree(
            &comm,
            "collective settings",
            format!(
                "slot {slot_bytes} B, algorithms {choices:?}, LL threads {ll_threads:?}, LL packets per block {ll_packets_per_block}"
            ),
        )?;
        // LL128 lines only between ranks of their own devices, two of them: the configuration
        // measured correct (2 x H200 over NVLink, thousands of calls). With 4 ranks on 2 GPUs (two
        // processes per GPU, three peers each) one run of 350 calls had 7 wrong elements (run27):
        // a line was seen with its flag but not all of its data. The host kernel orders each
        // line's flag after its data, so it serves any rank count. Every rank gathers every
        // rank's device and whether it can run the kernel, so every rank decides alike (a rank
        // that sends lines to one expecting packets would hang it); the scratch has LL128 halves
        // only where they are used.
        let ll128 = if device.info().caps.ll128 && slot_bytes % LL128_LINE_BYTES == 0 {
            match device.load_kernel(KernelId::COLLECTIVE_LL128_ALLREDUCE) {
                // 512 threads (or MSCCLPP_LL_THREADS), within the kernel's limit.
                Ok(k) => {
                    let threads = block_threads(device.info(), &*k, ll_threads, 512);
                    Some((k, threads))
                }
                Err(e) => {
                    tracing::info!("LL128 all-reduce unavailable: {e}");
                    None
                }
            }
        } else {
            None
        };
        let identity = {
            let info = device.info();
            let id = info
                .pci_bus_id
                .clone()
                .unwrap_or_else(|| info.ordinal.to_string());
            format!("{}:{}:{}", u8::from(ll128.is_some()), info.backend, id)
        };
        let all = comm.bootstrap().all_gather(identity.as_bytes())?;
        let everywhere = all.iter().all(|v| v.first() == Some(&b'1'));
        let devices: Vec<&[u8]> = all.iter().map(|v| v.get(2..).unwrap_or_default()).collect();
        let own_devices = (1..devices.len()).all(|i| !devices[..i].contains(&devices[i]));
        let line_safe = device.info().warp_size == 1 || (n == 2 && own_devices);
        let ll128 = ll128.filter(|_| everywhere && line_safe);
        let scratch = exchange_scratch(
            &comm,
            LlCollectiveArgs::scratch_bytes(slot_bytes, ll128.is_some()),
            "LL scratch",
        )?;
        let flag = device.alloc(LL_STATE_BYTES, MemoryKind::Device)?;
        let stream = device.create_stream()?;
        stream.fill(&flag.full(), 0)?;
        stream.synchronize()?;
        let direct = Self::setup_direct(&comm)?;
        let read = Self::setup_read(&comm)?;
        let ll_copy = device.load_kernel(KernelId::COLLECTIVE_LL_COPY)?;
        let load_all = |ids: &[[KernelId; 5]; 5]| {
            ids.iter()
                .flatten()
                .map(|&id| device.load_kernel(id))
                .collect::<Result<Vec<_>>>()
        };
        let ll_reduce = load_all(&KernelId::COLLECTIVE_LL_REDUCE)?;
        let ll_short_allreduce = load_all(&KernelId::COLLECTIVE_LL_SHORT_ALLREDUCE)?;
        let ll_short_reduce_scatter = load_all(&KernelId::COLLECTIVE_LL_SHORT_REDUCE_SCATTER)?;
        let ll_short_allgather = device.load_kernel(KernelId::COLLECTIVE_LL_SHORT_ALLGATHER)?;
        let ll_short_alltoall = device.load_kernel(KernelId::COLLECTIVE_LL_SHORT_ALLTOALL)?;
        // Nobody writes into a peer's scratch before that peer has zeroed it.
        comm.bootstrap().barrier()?;
        tracing::debug!(rank, nranks = n, slot_bytes, "collectives ready");
        Ok(Collectives {
            comm,
            scratch,
            flag,
            slot_bytes,
            ll_copy,
            ll_reduce,
            ll_short_allreduce,
            ll_short_reduce_scatter,
            ll_short_allgather,
            ll_short_alltoall,
            ll128,
            ll128_round_bytes: LlCollectiveArgs::ll128_round_bytes_of(slot_bytes),
            direct,
            read,
            choices,
            ll_threads,
            ll_packets_per_block,
            short: AtomicBool::new(short),
        })
    }

    /// The direct algorithm's scratch and kernel (`None` where the backend lacks the kernel).
    fn setup_direct(comm: &Communicator) -> Result<Option<Direct>> {
        let info = comm.device().info().clone();
        let n = comm.nranks() as u32;
        const SETTINGS: &str = "direct algorithm settings";
        let Some(kernel) = optional_kernel(comm, KernelId::COLLECTIVE_DIRECT, SETTINGS)? else {
            return Ok(None);
        };
        // GPUs: one block per SM at most (all resident), 896 threads or as many as the kernel's
        // register use allows (2 x H200, 1 GiB, busbw GB/s with 512 / 640 / 896 threads:
        // reduce-scatter 316 / 335 / 344, all-to-all - / - / 345, all-gather 352 / 354 / 356),
        // or MSCCLPP_DIRECT_THREADS at every size. The host: one worker.
        let forced: Option<u32> =
            mscclpp_hal::env::parse("MSCCLPP_DIRECT_THREADS", "threads per block")?;
        let threads = block_threads(&info, &*kernel, forced, 896);
        let (max_blocks, threads) = resident_grid(&info, threads);
        let small_threads = match forced {
            Some(_) => threads,
            None => DIRECT_SMALL_THREADS.min(threads),
        };
        let slot_bytes: u64 = match mscclpp_hal::env::parse::<u64>(
            "MSCCLPP_DIRECT_SLOT_BYTES",
            "a byte count",
        )? {
            Some(b) if b >= 4096 && b % 16 == 0 && b <= 16 << 20 => b,
            Some(b) => {
                return Err(Error::invalid(format!(
                    "MSCCLPP_DIRECT_SLOT_BYTES={b}: expected a multiple of 16 from 4096 to 16 MiB"
                )));
            }
            // 256 KiB slots for 2 ranks (1 GiB on 2 x H200, graph-timed: all-reduce 358 GB/s
            // busbw, all-gather 335, reduce-scatter 286, against 352/309/257 with 64 KiB); smaller
            // ones for more ranks keep the scratch (6 slots per rank and block) at 384 MiB.
            None if n > 4 => 64 << 10,
            None if n > 2 => 128 << 10,
            None => 256 << 10,
        };
        agree(
            comm,
            SETTINGS,
            format!(
                "{max_blocks} blocks of {threads} threads ({small_threads} up to {DIRECT_SMALL_BYTES} B of buffer), {slot_bytes} B slots"
            ),
        )?;
        let scratch = exchange_scratch(
            comm,
            DirectCollectiveArgs::scratch_bytes(slot_bytes, n, max_blocks),
            "direct scratch",
        )?;
        Ok(Some(Direct {
            scratch,
            slot_bytes,
            max_blocks,
            threads,
            small_threads,
            kernel,
        }))
    }

    /// The read algorithm's scratch, window table and kernel (`None` where the backend lacks
    /// the kernel).
    fn setup_read(comm: &Communicator) -> Result<Option<Read>> {
        let info = comm.device().info().clone();
        const SETTINGS: &str = "read algorithm settings";
        let Some(kernel) = optional_kernel(comm, KernelId::COLLECTIVE_READ_ALLREDUCE, SETTINGS)?
        else {
            return Ok(None);
        };
        let forced: Option<u32> =
            mscclpp_hal::env::parse("MSCCLPP_READ_THREADS", "threads per block")?;
        // 512 threads: a 1 MiB all-reduce is one 16-byte unit per thread on 128 blocks.
        let threads = block_threads(&info, &*kernel, forced, 512);
        let (max_blocks, threads) = resident_grid(&info, threads);
        let staging_bytes: u64 = 4 << 20;
        agree(
            comm,
            SETTINGS,
            format!("{max_blocks} blocks of {threads} threads, {staging_bytes} B staging"),
        )?;
        let scratch = exchange_scratch(
            comm,
            ReadCollectiveArgs::scratch_bytes(staging_bytes, max_blocks),
            "read scratch",
        )?;
        // Window 0 of the table: every rank's staging area.
        let table = comm
            .device()
            .alloc(WINDOW_TABLE_BYTES, MemoryKind::Device)?;
        let staging = ReadCollectiveArgs::staging_offset(max_blocks);
        let mut bases = [0u64; MAX_RANKS];
        let mut lens = [0u64; MAX_RANKS];
        for p in 0..comm.nranks() {
            bases[p] = scratch.addrs[p] + staging;
            lens[p] = staging_bytes;
        }
        let stream = comm.device().create_stream()?;
        stream.fill(&table.full(), 0)?;
        write_window_row(&*stream, &table, 0, &bases, &lens)?;
        stream.synchronize()?;
        Ok(Some(Read {
            scratch,
            table,
            staging_bytes,
            max_blocks,
            threads,
            kernel,
            windows: Mutex::new(Vec::new()),
        }))
    }

    /// The algorithm that serves `kind` for rank blocks of `block_bytes`.
    ///
    /// The read algorithm is never chosen by size: on 2 x H200 (graph-timed, bf16) it never beat
    /// both others even with registered inputs — 64 KiB 7.5 µs (LL 3.1), 1 MiB 10.9 (LL 8.8),
    /// 2 MiB 14.4 (direct 14.5), 4 MiB 20.6 (direct 20.8): its two handshakes and the remote-read
    /// round trip cost more than LL's doubled bytes below 2 MiB, and above it both read and
    /// direct run at the same ~300 GB/s. It serves when forced (`MSCCLPP_ALGO_ALLREDUCE=read`).
    pub fn algorithm(&self, kind: CollectiveKind, block_bytes: u64) -> Algorithm {
        let read_fits = kind == CollectiveKind::AllReduce
            && self
                .read
                .as_ref()
                .is_some_and(|r| r.blocks(block_bytes).is_some());
        let ll128_fits = kind == CollectiveKind::AllReduce
            && self.ll128.is_some()
            && block_bytes <= self.ll128_round_bytes;
        // A forced algorithm that cannot serve this call (too large, or not here): what `auto`
        // picks.
        let choice = match self.choices[kind as usize] {
            Choice::Forced(Algorithm::Ll128) if !ll128_fits => Choice::Auto,
            Choice::Forced(Algorithm::Read) if !read_fits => Choice::Auto,
            c => c,
        };
        match (choice, &self.direct) {
            (Choice::Forced(a @ (Algorithm::Ll128 | Algorithm::Read)), _) => a,
            (Choice::Auto, _) if ll128_fits && ll128_range().contains(&block_bytes) => {
                Algorithm::Ll128
            }
            (Choice::Forced(a), Some(_)) => a,
            (Choice::Forced(_), None) | (Choice::Auto, None) => Algorithm::Ll,
            (Choice::Auto, Some(_)) if block_bytes >= direct_threshold(kind) => Algorithm::Direct,
            (Choice::Auto, Some(_)) => Algorithm::Ll,
        }
    }

    /// Registers `slice` with every rank's collectives (a collective call: every rank registers
    /// one buffer of its own, in the same order on every rank). All-reduces whose input lies in a
    /// registered buffer let the peers read it where it is instead of a copy; the IPC mappings
    /// are made here, once. The buffer stays alive until [`Collectives::deregister`].
    pub fn register(&self, slice: &BufferSlice) -> Result<Window> {
        let read = self.read.as_ref().ok_or_else(|| {
            Error::unavailable(
                "registering a buffer with the collectives",
                format!(
                    "the {} backend has no read all-reduce kernel",
                    self.comm.device().info().backend
                ),
            )
        })?;
        let rank = self.comm.rank();
        if slice.buffer().backend() != self.comm.device().info().backend {
            return Err(Error::invalid(format!(
                "register: the buffer belongs to the {} backend, the communicator to {}",
                slice.buffer().backend(),
                self.comm.device().info().backend
            )));
        }
        let mut windows = read.windows.lock().unwrap_or_else(|p| p.into_inner());
        let index = match windows.iter().position(Option::is_none) {
            Some(i) => i + 1,
            None => windows.len() + 1,
        };
        // Every rank must register the same window (a rank that skipped a registration, or
        // deregistered another, would read the wrong buffer); all of them fail otherwise.
        agree(
            &self.comm,
            "registered windows (every rank must register and deregister in the same order)",
            format!("window {index}"),
        )?;
        if index >= MAX_WINDOWS {
            return Err(Error::invalid(format!(
                "register: {} buffers are registered already, the most a communicator holds",
                MAX_WINDOWS - 1
            )));
        }
        let maps = map_peers(&self.comm, slice, "registered buffer")?;
        let stream = self.comm.device().create_stream()?;
        write_window_row(&*stream, &read.table, index, &maps.bases, &maps.lens)?;
        stream.synchronize()?;
        let entry = WindowEntry {
            slice: slice.clone(),
            _peers: maps.peers,
        };
        if index > windows.len() {
            windows.push(Some(entry));
        } else {
            windows[index - 1] = Some(entry);
        }
        tracing::debug!(rank, index, bytes = slice.len(), "buffer registered");
        Ok(Window(index))
    }

    /// Deregisters a window (a collective call, in the same order on every rank). Every call
    /// that used it must have finished on its stream, on every rank.
    pub fn deregister(&self, window: Window) -> Result<()> {
        let read = self
            .read
            .as_ref()
            .ok_or_else(|| Error::invalid("deregister: no buffer was ever registered here"))?;
        let mut windows = read.windows.lock().unwrap_or_else(|p| p.into_inner());
        let i = window.0;
        let known = i != 0 && windows.get(i - 1).is_some_and(Option::is_some);
        // Every rank must deregister the same registered window; all of them fail otherwise
        // (none is left waiting for the others).
        agree(
            &self.comm,
            "deregistered windows",
            if known {
                format!("window {i}")
            } else {
                format!("window {i}, which is not registered")
            },
        )
        .and_then(|()| {
            if known {
                Ok(())
            } else {
                Err(Error::invalid(format!(
                    "deregister: window {i} is not registered with this communicator"
                )))
            }
        })?;
        let stream = self.comm.device().create_stream()?;
        write_window_row(&*stream, &read.table, i, &[0; MAX_RANKS], &[0; MAX_RANKS])?;
        stream.synchronize()?;
        // No peer unmaps this buffer while another rank could still name it.
        self.comm.bootstrap().barrier()?;
        windows[i - 1] = None;
        Ok(())
    }

    /// Where `slice`'s bytes `[ptr, ptr + bytes)` are, as a read key: in a registered window,
    /// or the staging area (window 0).
    fn read_key_of(read: &Read, ptr: u64, bytes: u64) -> u64 {
        let windows = read.windows.lock().unwrap_or_else(|p| p.into_inner());
        windows
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.as_ref().map(|w| (i + 1, w)))
            .find_map(|(i, w)| {
                let start = w.slice.ptr().0;
                let end = start + w.slice.len() as u64;
                (ptr >= start && ptr + bytes <= end)
                    .then(|| read_key(i, ptr - start))
                    .flatten()
            })
            .unwrap_or(0)
    }

    /// The communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.comm
    }

    /// `output = reduce(op, input of every rank)`; `count` elements each. In place when both
    /// slices are the same memory.
    pub fn all_reduce(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &dyn Stream,
    ) -> Result<()> {
        self.launch(
            CollectiveKind::AllReduce,
            input,
            output,
            count,
            dtype,
            op,
            0,
            stream,
        )
    }

    /// `output` (`nranks * count` elements) = every rank's `input` (`count`), by rank.
    pub fn all_gather(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        stream: &dyn Stream,
    ) -> Result<()> {
        self.launch(
            CollectiveKind::AllGather,
            input,
            output,
            count,
            dtype,
            ReduceOp::Sum,
            0,
            stream,
        )
    }

    /// `output` (`count`) = reduction over ranks of block `rank` of `input` (`nranks * count`).
    pub fn reduce_scatter(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &dyn Stream,
    ) -> Result<()> {
        self.launch(
            CollectiveKind::ReduceScatter,
            input,
            output,
            count,
            dtype,
            op,
            0,
            stream,
        )
    }

    /// `output` = `input` of `root` (`count` elements; only the root's input is read).
    pub fn broadcast(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &dyn Stream,
    ) -> Result<()> {
        self.launch(
            CollectiveKind::Broadcast,
            input,
            output,
            count,
            dtype,
            ReduceOp::Sum,
            root,
            stream,
        )
    }

    /// Block `p` of `output` = block `rank` of rank `p`'s `input` (`nranks * count` each).
    pub fn all_to_all(
        &self,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        stream: &dyn Stream,
    ) -> Result<()> {
        self.launch(
            CollectiveKind::AllToAll,
            input,
            output,
            count,
            dtype,
            ReduceOp::Sum,
            0,
            stream,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        kind: CollectiveKind,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: &dyn Stream,
    ) -> Result<()> {
        let (rank, n) = (self.comm.rank(), self.comm.nranks());
        if root >= n {
            return Err(Error::invalid(format!(
                "{}: root {root} is not a rank of {n}",
                kind.name()
            )));
        }
        let (in_elems, out_elems) = kind.buffer_elements(count as u64, n as u64);
        let need = |elems: u64| {
            elems
                .checked_mul(dtype.size() as u64)
                .filter(|b| *b <= isize::MAX as u64)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "{}: count {count} of {dtype} overflows",
                        kind.name()
                    ))
                })
        };
        let (in_bytes, out_bytes) = (need(in_elems)?, need(out_elems)?);
        for (what, s, bytes) in [("input", input, in_bytes), ("output", output, out_bytes)] {
            if (s.len() as u64) < bytes {
                return Err(Error::invalid(format!(
                    "{}: {what} of {} bytes is too small for {count} {dtype} elements ({bytes} bytes needed on {n} ranks)",
                    kind.name(),
                    s.len()
                )));
            }
            if s.buffer().backend() != self.comm.device().info().backend {
                return Err(Error::invalid(format!(
                    "{}: {what} belongs to the {} backend, the communicator to {}",
                    kind.name(),
                    s.buffer().backend(),
                    self.comm.device().info().backend
                )));
            }
        }
        let (i0, o0) = (input.ptr().0, output.ptr().0);
        let overlap = i0 < o0 + out_bytes && o0 < i0 + in_bytes;
        if overlap {
            let ok = match kind {
                CollectiveKind::AllReduce | CollectiveKind::Broadcast => i0 == o0,
                CollectiveKind::AllGather => i0 == o0 + rank as u64 * in_bytes,
                CollectiveKind::ReduceScatter => o0 == i0 + rank as u64 * out_bytes,
                CollectiveKind::AllToAll => false,
            };
            if !ok {
                return Err(Error::invalid(format!(
                    "{}: input and output overlap in a way the collective does not support (in place means: {})",
                    kind.name(),
                    match kind {
                        CollectiveKind::AllReduce | CollectiveKind::Broadcast => "the same buffer",
                        CollectiveKind::AllGather => "input = output block `rank`",
                        CollectiveKind::ReduceScatter => "output = input block `rank`",
                        CollectiveKind::AllToAll => "not supported for all-to-all",
                    }
                )));
            }
        }
        let block_bytes = count as u64 * dtype.size() as u64;
        let algorithm = self.algorithm(kind, block_bytes);
        if let (Algorithm::Read, Some(r)) = (algorithm, &self.read) {
            // `algorithm` chose read only where it fits.
            let blocks = r.blocks(block_bytes).ok_or_else(|| {
                Error::invalid(format!(
                    "allreduce: {block_bytes} bytes exceed what the read algorithm holds"
                ))
            })?;
            let args = ReadCollectiveArgs {
                input: i0,
                output: o0,
                count: count as u64,
                scratch: r.scratch.addrs[rank],
                table: r.table.ptr().0,
                in_key: Self::read_key_of(r, i0, in_bytes),
                staging_bytes: r.staging_bytes,
                peer_scratch: r.scratch.addrs,
                dtype: dtype as u32,
                op: op as u32,
                rank: rank as u32,
                nranks: n as u32,
                max_blocks: r.max_blocks,
                _pad: 0,
            };
            let cfg = LaunchConfig::linear(blocks, r.threads);
            tracing::trace!(collective = kind.name(), count, %dtype, %op, ?cfg, key = args.in_key, "launch read");
            // SAFETY: as for the LL launch below, with the read scratch, table and window
            // mappings held in `self` (a window stays mapped until deregistered, which the caller
            // does only after its calls have finished).
            return unsafe { stream.launch_raw(&*r.kernel, cfg, args.as_bytes()) };
        }
        if let (Algorithm::Direct, Some(d)) = (algorithm, &self.direct) {
            let (blocks, chunk) =
                DirectCollectiveArgs::plan(kind, block_bytes, n as u32, d.slot_bytes, d.max_blocks);
            let args = DirectCollectiveArgs {
                input: i0,
                output: o0,
                count: count as u64,
                scratch: d.scratch.addrs[rank],
                slot_bytes: d.slot_bytes,
                chunk_bytes: chunk,
                peer_scratch: d.scratch.addrs,
                kind: kind as u32,
                dtype: dtype as u32,
                op: op as u32,
                rank: rank as u32,
                nranks: n as u32,
                root: root as u32,
                max_blocks: d.max_blocks,
                _pad: 0,
            };
            let threads = if in_bytes.max(out_bytes) <= DIRECT_SMALL_BYTES {
                d.small_threads
            } else {
                d.threads
            };
            let cfg = LaunchConfig::linear(blocks, threads);
            tracing::trace!(collective = kind.name(), count, %dtype, %op, ?cfg, chunk, "launch direct");
            // SAFETY: as for the LL launch below, with the direct scratch mappings held in `self`.
            return unsafe { stream.launch_raw(&*d.kernel, cfg, args.as_bytes()) };
        }
        let args = LlCollectiveArgs {
            input: i0,
            output: o0,
            count: count as u64,
            flag: self.flag.ptr().0,
            scratch: self.scratch.addrs[rank],
            slot_bytes: self.slot_bytes,
            peer_scratch: self.scratch.addrs,
            kind: kind as u32,
            dtype: dtype as u32,
            op: op as u32,
            rank: rank as u32,
            nranks: n as u32,
            root: root as u32,
        };
        if let (Algorithm::Ll128, Some((k, threads))) = (algorithm, &self.ll128) {
            let cfg = self.ll128_grid(*threads, block_bytes);
            tracing::trace!(collective = kind.name(), count, %dtype, %op, ?cfg, "launch ll128");
            // SAFETY: as for the LL launch below (the same arguments, scratch and flag).
            return unsafe { stream.launch_raw(&**k, cfg, args.as_bytes()) };
        }
        let index = dtype as usize * ReduceOp::ALL.len() + op as usize;
        let short = match kind {
            _ if !self.short.load(Ordering::Relaxed) => None,
            CollectiveKind::AllReduce => Some(&self.ll_short_allreduce[index]),
            CollectiveKind::ReduceScatter => Some(&self.ll_short_reduce_scatter[index]),
            CollectiveKind::AllGather => Some(&self.ll_short_allgather),
            CollectiveKind::AllToAll => Some(&self.ll_short_alltoall),
            // Its acknowledgements stay with the general kernel.
            CollectiveKind::Broadcast => None,
        };
        // A short kernel's grid covers one rank block (the general kernel's, the larger buffer).
        let short = short.and_then(|k| {
            let cfg = self.grid(block_bytes);
            self.short_fits(&args, block_bytes, &cfg)
                .then_some((k, cfg))
        });
        let (kernel, cfg) = match short {
            Some(short) => short,
            None if kind.reduces() => (&self.ll_reduce[index], self.grid(in_bytes.max(out_bytes))),
            None => (&self.ll_copy, self.grid(in_bytes.max(out_bytes))),
        };
        tracing::trace!(collective = kind.name(), count, %dtype, %op, ?cfg, kernel = %kernel.id(), "launch");
        // SAFETY: the addresses are the caller's checked slices (kept alive by the caller until
        // the stream passes the call, as for every stream operation), this communicator's scratch
        // and flag, and the peers' scratch mappings held in `self`.
        unsafe { stream.launch_raw(&**kernel, cfg, args.as_bytes()) }
    }

    /// Lets one-round all-reduce, reduce-scatter, all-gather and all-to-all calls take the short
    /// kernels (`true`, the default unless `MSCCLPP_LL_SHORT=0`) or keeps them on the general LL
    /// kernel. A per-rank choice, for measurements and debugging: ranks may differ, since both
    /// kernels run the same protocol. Takes effect from the next call.
    pub fn use_short_kernels(&self, on: bool) {
        self.short.store(on, Ordering::Relaxed);
    }

    /// Whether a short kernel serves `bytes` per rank block launched as `cfg`: one round, and a
    /// thread per packet (the host kernel serves any grid). Ranks need not agree: the short and
    /// the general kernels run the same protocol.
    fn short_fits(&self, args: &LlCollectiveArgs, bytes: u64, cfg: &LaunchConfig) -> bool {
        let any_grid = self.comm.device().info().warp_size == 1;
        short_fits(bytes, args.round_bytes(), cfg, any_grid)
    }

    /// LL128: a group of eight threads per line, 512 threads per block (or as forced by
    /// `MSCCLPP_LL_THREADS`), up to one block per SM, threads looping over lines beyond that.
    fn ll128_grid(&self, threads: u32, bytes: u64) -> LaunchConfig {
        let info = self.comm.device().info();
        if info.warp_size == 1 {
            return LaunchConfig::linear(1, 1);
        }
        let lines = bytes.div_ceil(LL128_LINE_DATA_BYTES);
        let blocks = (lines * 8)
            .div_ceil(u64::from(threads))
            .clamp(1, u64::from(info.multiprocessors.max(1)));
        LaunchConfig::linear(blocks as u32, threads)
    }

    fn grid(&self, bytes: u64) -> LaunchConfig {
        let info = self.comm.device().info();
        if info.warp_size == 1 {
            return LaunchConfig::linear(1, 1);
        }
        ll_grid(
            bytes,
            self.slot_bytes,
            self.ll_packets_per_block,
            self.ll_threads,
            info.multiprocessors,
            info.max_threads_per_block,
        )
    }
}

/// The LL grid of a GPU for a call whose larger buffer holds `bytes`: one block per
/// `packets_per_block` packets of a round, up to one block per SM (the blocks of a multi-round
/// call meet at grid barriers, so all must be resident); when that leaves a thread more than one
/// packet, larger blocks (up to the device's limit), since a thread's packets are sent and
/// awaited one after the other. A block has as many threads as packets (whole warps): padding a
/// 1 KiB all-reduce's 128 packets to 512 threads cost 0.1 µs on 2 x H200 (2.43 vs 2.51-2.59,
/// run26). `ll_threads` (`MSCCLPP_LL_THREADS`) forces the block size.
fn ll_grid(
    bytes: u64,
    slot_bytes: u64,
    packets_per_block: u64,
    ll_threads: Option<u32>,
    multiprocessors: u32,
    max_threads_per_block: u32,
) -> LaunchConfig {
    let max_threads = max_threads_per_block.clamp(32, 1024);
    let packets = bytes.div_ceil(8).min(slot_bytes / 16);
    let blocks = packets
        .div_ceil(packets_per_block.max(1))
        .clamp(1, u64::from(multiprocessors.max(1)));
    let threads = match ll_threads {
        Some(t) => t.min(max_threads),
        None => {
            let per_block = packets.div_ceil(blocks).next_multiple_of(32);
            per_block.clamp(32, u64::from(max_threads)) as u32
        }
    };
    LaunchConfig::linear(blocks as u32, threads)
}

/// Whether a short kernel serves `bytes` per rank block launched as `cfg`: one round of
/// `round_bytes`, and a thread per packet unless the backend's kernel serves any grid (the host).
fn short_fits(bytes: u64, round_bytes: u64, cfg: &LaunchConfig, any_grid: bool) -> bool {
    let threads = u64::from(cfg.grid[0]) * u64::from(cfg.block[0]);
    bytes > 0 && bytes <= round_bytes && (any_grid || threads * 8 >= bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOT: u64 = DEFAULT_SLOT_BYTES;
    const ROUND: u64 = SLOT / 8 * 8 / 2;

    /// An H200: 132 SMs, 1024 threads per block.
    fn h200(bytes: u64, ll_threads: Option<u32>) -> LaunchConfig {
        ll_grid(bytes, SLOT, 256, ll_threads, 132, 1024)
    }

    #[test]
    fn every_one_round_call_gets_a_short_grid_with_the_defaults() {
        // Every size up to one round, odd ones included, for 2-byte and 4-byte elements.
        let mut bytes = 2;
        while bytes <= ROUND {
            let cfg = h200(bytes, None);
            assert!(short_fits(bytes, ROUND, &cfg, false), "{bytes} B: {cfg:?}");
            assert!(cfg.grid[0] <= 132 && cfg.block[0] <= 1024 && cfg.block[0] % 32 == 0);
            bytes = if bytes < 4096 {
                bytes + 2
            } else {
                bytes * 3 / 2 / 4 * 4 + 4
            };
        }
        assert!(short_fits(ROUND, ROUND, &h200(ROUND, None), false));
    }

    #[test]
    fn the_general_kernel_serves_what_a_short_one_cannot() {
        // More than one round, nothing, or a forced block size that leaves threads short.
        assert!(!short_fits(ROUND + 2, ROUND, &h200(ROUND + 2, None), false));
        assert!(!short_fits(0, ROUND, &h200(0, None), false));
        let forced = h200(ROUND, Some(32));
        assert_eq!(forced.block[0], 32);
        assert!(!short_fits(ROUND, ROUND, &forced, false));
        // The host's kernel serves any grid.
        assert!(short_fits(ROUND, ROUND, &LaunchConfig::linear(1, 1), true));
        // A device with few SMs cannot give 1 MiB a thread per packet.
        let small = ll_grid(ROUND, SLOT, 256, None, 8, 1024);
        assert!(!short_fits(ROUND, ROUND, &small, false));
        assert!(short_fits(
            64 << 10,
            ROUND,
            &ll_grid(64 << 10, SLOT, 256, None, 8, 1024),
            false
        ));
    }

    #[test]
    fn the_1_kib_grid_is_one_block_of_its_packets() {
        assert_eq!(h200(1024, None), LaunchConfig::linear(1, 128));
        assert_eq!(h200(64 << 10, None), LaunchConfig::linear(32, 256));
    }
}
