//! `ncclDevCommCreate`/`ncclDevCommDestroy`: the requirements a client compiled read at its
//! version's offsets, the resources laid out in one symmetric buffer (zeroed; LSA barriers
//! first, then the client's own requirements, each at a 128-byte boundary as NCCL's handles
//! count), and the `ncclDevComm` written at the client's layout. GIN gets its signal arrays in
//! the resources and its proxy ([`super::gin`]), which reaches other hosts through
//! [`super::hosts`]. What is not served — multimem, CFT, RAIL and CUSTOM GIN connections — is
//! refused naming the field, before anything is allocated.

use std::ffi::c_void;

use std::sync::Arc;

use super::gin;
use super::layout::{self, DevCommLayout, DevCommValues, RESOURCE_UNIT, reqs};
use super::space::{Mapped, Space};
use crate::error::{Failure, Res};

/// Reads a `T` at `at` bytes into `base` when it lies within `size` bytes, else `None`.
///
/// # Safety
/// `base` is valid for reads of `size` bytes.
unsafe fn field<T: Copy>(base: *const u8, size: usize, at: usize) -> Option<T> {
    // SAFETY: in bounds of the caller's `size` bytes (checked); unaligned read of a plain value.
    (at + size_of::<T>() <= size).then(|| unsafe { base.add(at).cast::<T>().read_unaligned() })
}

/// Longest requirement list walked (a cycle in a client's list fails instead of looping).
const MAX_LIST: usize = 1 << 16;

/// One resource to place: bytes, alignment, where its handle goes, its GIN signals and
/// counters and where their first ids go.
struct Resource {
    bytes: usize,
    align: usize,
    out: *mut u32,
    gin: (u32, u32, *mut u32, *mut u32),
}

impl Resource {
    fn plain(bytes: usize, align: usize, out: *mut u32) -> Resource {
        Resource {
            bytes,
            align,
            out,
            gin: (0, 0, std::ptr::null_mut(), std::ptr::null_mut()),
        }
    }
}

/// A created device communicator: its resources, kept until destroyed.
#[derive(Debug)]
pub struct DevComm {
    /// Its GIN proxy and memory (stopped before the resources are unmapped).
    pub gin: Option<super::gin::Gin>,
    /// The resource buffer's symmetric mapping (`None` without resources).
    pub resources: Option<(Mapped, mscclpp::hal::DeviceBuffer)>,
}

/// What the client's requirements ask for, read and checked.
struct Asked {
    version: u32,
    layout: DevCommLayout,
    lsa_barriers: u32,
    /// `barrierCount` (2.30 on: hybrid barriers).
    barriers: u32,
    /// `railGinBarrierCount`.
    rail: u32,
    gin: Option<GinAsk>,
    resources: Vec<Resource>,
}

/// Reads and checks `ncclDevCommRequirements` at `r`; `headers`: the communicator's
/// `ncclConfig_t.version` (which names a 2.28 client's release).
///
/// # Safety
/// `r` points to the client's requirements (at least its `size` bytes).
unsafe fn read(r: *const u8, headers: Option<u32>) -> Res<Asked> {
    // SAFETY: 16 bytes exist in every layout (2.28.3's has 24).
    let magic = unsafe { r.add(reqs::MAGIC).cast::<u32>().read_unaligned() };
    // NCCL 2.28's requirements carry no magic: read as 2.29.2's, the release learnt elsewhere.
    let unversioned = if magic == layout::API_MAGIC {
        None
    } else {
        let v = crate::headers::unversioned(headers).map_err(|e| Failure {
            message: format!("ncclDevCommCreate: {}", e.message),
            ..e
        })?;
        // SAFETY: the client's requirements of release `v` (the caller's contract).
        Some(unsafe { layout::reqs228::versioned(r, v) })
    };
    let r = unversioned.as_ref().map_or(r, |v| v.as_ptr());
    // SAFETY: the header (16 bytes) of a versioned layout; `size` says the rest.
    let (size, version) = unsafe {
        (
            r.cast::<u64>().read_unaligned() as usize,
            r.add(reqs::VERSION).cast::<u32>().read_unaligned(),
        )
    };
    if version > crate::abi::NCCL_VERSION_CODE as u32 {
        return Err(Failure::usage(format!(
            "ncclDevCommCreate: the client was built against NCCL {}, newer than the {} this library serves",
            layout::version_name(version),
            layout::version_name(crate::abi::NCCL_VERSION_CODE as u32)
        )));
    }
    let layout = DevCommLayout::of(version)
        .map_err(|e| Failure::usage(format!("ncclDevCommCreate: {e}")))?;
    if !(reqs::LSA_BARRIER_COUNT + 4..=4096).contains(&size) {
        return Err(Failure::argument(format!(
            "ncclDevCommCreate: requirements of {size} bytes (NCCL {} lays out at least {})",
            layout::version_name(version),
            reqs::GIN_COUNTER_COUNT + 4
        )));
    }
    // SAFETY: each read is bounded by the caller's `size` (the caller's contract).
    let get = |at: usize| unsafe { field::<i32>(r, size, at) }.unwrap_or(0);
    // SAFETY: as above.
    let flag = |at: usize| unsafe { field::<u8>(r, size, at) }.unwrap_or(0) != 0;
    // SAFETY: as above.
    let ptr = |at: usize| unsafe { field::<*const u8>(r, size, at) }.unwrap_or(std::ptr::null());
    let mut lsa = get(reqs::LSA_BARRIER_COUNT);
    let mut barriers = get(reqs::BARRIER_COUNT);
    let mut rail = get(reqs::RAIL_GIN_BARRIER_COUNT);
    if layout == DevCommLayout::V22807 && rail != 0 {
        // 2.28.7 to 2.28.9 declare rail GIN barriers; GIN is served from 2.30.3's layout on.
        return Err(Failure::usage(format!(
            "ncclDevCommCreate: railGinBarrierCount {rail} asks for GIN barriers, which this \
             library serves to clients built against NCCL 2.30.3 or newer (this one: NCCL {})",
            layout::version_name(version)
        )));
    }
    if matches!(layout, DevCommLayout::V22807 | DevCommLayout::V22902) {
        // 2.28.7 to 2.29.3: `barrierCount` asked for LSA barriers only (NCCL folds it in).
        lsa += barriers;
        barriers = 0;
        rail = 0;
    }
    let counts = [
        ("lsaBarrierCount", lsa),
        ("barrierCount", barriers),
        ("railGinBarrierCount", rail),
    ];
    if let Some((name, v)) = counts.iter().find(|(_, v)| *v < 0) {
        return Err(Failure::argument(format!(
            "ncclDevCommCreate: {name} {v} is negative"
        )));
    }
    let user_signals = get(reqs::GIN_SIGNAL_COUNT);
    let user_counters = get(reqs::GIN_COUNTER_COUNT);
    let world = if version >= 23000 {
        get(reqs::WORLD_GIN_BARRIER_COUNT)
    } else {
        0
    };
    let connection = if version >= 22907 {
        get(reqs::GIN_CONNECTION_TYPE)
    } else {
        0
    };
    let counts = [
        ("ginSignalCount", user_signals),
        ("ginCounterCount", user_counters),
        ("worldGinBarrierCount", world),
        ("ginContextCount", get(reqs::GIN_CONTEXT_COUNT)),
    ];
    if let Some((name, v)) = counts.iter().find(|(_, v)| *v < 0) {
        return Err(Failure::argument(format!(
            "ncclDevCommCreate: {name} {v} is negative"
        )));
    }
    if flag(reqs::LSA_MULTIMEM) {
        return Err(Failure::usage(
            "ncclDevCommCreate: lsaMultimem asks for NVLink multicast (NVLS), which this library never creates: \
             ncclCommQueryProperties reports multimemSupport false",
        ));
    }
    for (name, at) in [
        ("cftCaps", reqs::CFT_CAPS),
        ("cftBarrierCount", reqs::CFT_BARRIER_COUNT),
    ] {
        if get(at) != 0 {
            return Err(Failure::usage(format!(
                "ncclDevCommCreate: {name} {} asks for CFT load/store entries, which this library does not serve",
                get(at)
            )));
        }
    }
    let mut team = ptr(reqs::TEAM_LIST);
    let mut walked = 0;
    while !team.is_null() {
        walked += 1;
        if walked > MAX_LIST {
            return Err(Failure::argument(
                "ncclDevCommCreate: teamRequirementsList does not end",
            ));
        }
        // SAFETY: a node of the client's list (32 bytes in every version).
        let (multimem, next) = unsafe {
            (
                team.add(reqs::team::MULTIMEM).read() != 0,
                team.add(reqs::team::NEXT)
                    .cast::<*const u8>()
                    .read_unaligned(),
            )
        };
        if multimem {
            return Err(Failure::usage(
                "ncclDevCommCreate: a team requirement asks for multimem (NVLink multicast), which this library never creates",
            ));
        }
        team = next;
    }
    let mut resources = Vec::new();
    // 2.28.3's nodes end before the GIN fields.
    let node_bytes = if version < 22807 {
        layout::reqs228::RESOURCE_BYTES_22803
    } else {
        reqs::resource::BYTES
    };
    let mut node = ptr(reqs::RESOURCE_LIST);
    while !node.is_null() {
        if resources.len() >= MAX_LIST {
            return Err(Failure::argument(
                "ncclDevCommCreate: resourceRequirementsList does not end",
            ));
        }
        use reqs::resource as f;
        // SAFETY: a node of the client's list, `node_bytes` long.
        let at = |o: usize| unsafe { field::<u64>(node, node_bytes, o) }.unwrap_or(0);
        // SAFETY: as above.
        let count = |o: usize| unsafe { field::<i32>(node, node_bytes, o) }.unwrap_or(0);
        let (next, bytes, align, out) = (
            at(f::NEXT) as *const u8,
            at(f::BUFFER_SIZE),
            at(f::BUFFER_ALIGN),
            at(f::OUT_BUFFER_HANDLE) as *mut u32,
        );
        let (signals, counters) = (count(f::GIN_SIGNAL_COUNT), count(f::GIN_COUNTER_COUNT));
        let (out_signal, out_counter) = (
            at(f::OUT_GIN_SIGNAL_START) as *mut u32,
            at(f::OUT_GIN_COUNTER_START) as *mut u32,
        );
        if signals < 0 || counters < 0 {
            return Err(Failure::argument(format!(
                "ncclDevCommCreate: a resource requirement of {signals} GIN signals and {counters} counters"
            )));
        }
        let bytes = usize::try_from(bytes)
            .ok()
            .filter(|&b| b <= 1 << 40)
            .ok_or_else(|| {
                Failure::argument(format!("ncclDevCommCreate: a resource of {bytes} bytes"))
            })?;
        let align = usize::try_from(align).unwrap_or(usize::MAX);
        if align > 1 << 30 || (align != 0 && !align.is_power_of_two()) {
            return Err(Failure::argument(format!(
                "ncclDevCommCreate: a resource alignment of {align} (a power of two is needed)"
            )));
        }
        resources.push(Resource {
            bytes,
            align,
            out,
            gin: (signals as u32, counters as u32, out_signal, out_counter),
        });
        node = next;
    }
    let asks_gin = user_signals > 0
        || user_counters > 0
        || world > 0
        || rail > 0
        || resources.iter().any(|r| r.gin.0 > 0 || r.gin.1 > 0);
    let force = flag(reqs::GIN_FORCE_ENABLE);
    let gin = match (connection, force) {
        // The layouts served before 2.29.7 (2.28.x, 2.29.2) have no connection field: asking
        // for GIN is asking for it.
        (0, false) if asks_gin && version >= 22907 => {
            return Err(Failure::argument(
                "ncclDevCommCreate: GIN signals, counters or GIN barriers are asked for with ginConnectionType NCCL_GIN_CONNECTION_NONE (set NCCL_GIN_CONNECTION_FULL)",
            ));
        }
        (0, false) if !asks_gin => None,
        (0..=4, _) => {
            if connection >= 2 {
                // RAIL and CUSTOM name a subset of peers GIN must reach; every rank is reached
                // here, a superset, so the client's kernels find every peer they expect.
                tracing::info!(
                    target: crate::debug::INIT,
                    "ncclDevCommCreate: ginConnectionType {connection} served as NCCL_GIN_CONNECTION_FULL (every rank a GIN peer)"
                );
            }
            let ctx_stride = super::gin::context_stride(version)
                .map_err(|e| Failure::usage(format!("ncclDevCommCreate: {e}")))?;
            let ty = if version >= 23100 {
                get(reqs::GIN_TYPE)
            } else {
                0
            };
            if ty != 0 && ty != i32::from(layout::GIN_TYPE_PROXY) {
                return Err(Failure::usage(format!(
                    "ncclDevCommCreate: ginType {ty} asked for; this library serves GIN of the proxy type ({})",
                    layout::GIN_TYPE_PROXY
                )));
            }
            // A hint, as NCCL's header says: clients read the count back from the devcomm.
            let asked_contexts = get(reqs::GIN_CONTEXT_COUNT).max(1) as usize;
            let contexts = asked_contexts.min(MAX_CONTEXTS);
            if contexts < asked_contexts {
                tracing::info!(
                    target: crate::debug::INIT,
                    "ncclDevCommCreate: ginContextCount {asked_contexts} asked, {contexts} given (ncclDevComm.ginContextCount)"
                );
            }
            let depth = if version >= 22907 {
                get(reqs::GIN_QUEUE_DEPTH)
            } else {
                0
            };
            let queue = if depth > 0 {
                (depth as usize).next_power_of_two().clamp(16, 1 << 16)
            } else {
                DEFAULT_QUEUE
            };
            Some(GinAsk {
                ctx_stride,
                contexts,
                queue,
                user_signals: user_signals as u32,
                user_counters: user_counters as u32,
                world: world as u32,
                strong_legacy: version < 23007 || flag(reqs::GIN_STRONG_SIGNALS_REQUIRED),
            })
        }
        (c, _) => {
            return Err(Failure::argument(format!(
                "ncclDevCommCreate: ginConnectionType {c} is none of NCCL's (NONE, FULL, RAIL, CUSTOM_STRIDE, CUSTOM_ARRAY: 0 to 4)"
            )));
        }
    };
    if gin.is_none() && rail > 0 {
        return Err(Failure::argument(
            "ncclDevCommCreate: railGinBarrierCount asks for GIN",
        ));
    }
    Ok(Asked {
        version,
        layout,
        lsa_barriers: lsa as u32,
        barriers: barriers as u32,
        rail: rail as u32,
        gin,
        resources,
    })
}

/// Most GIN contexts served.
const MAX_CONTEXTS: usize = 32;
/// Slots per GIN queue unless the client asks (`ginQueueDepth`).
const DEFAULT_QUEUE: usize = 256;

/// What a client's GIN requirements ask for.
struct GinAsk {
    ctx_stride: usize,
    contexts: usize,
    queue: usize,
    user_signals: u32,
    user_counters: u32,
    world: u32,
    strong_legacy: bool,
}

/// `ncclDevCommCreate` on `space`: collective over the communicator; `headers` as for [`read`].
///
/// # Safety
/// `r` points to the client's requirements; `out` to an `ncclDevComm` of the client's version.
pub unsafe fn create(
    space: &Arc<Space>,
    r: *const c_void,
    out: *mut c_void,
    headers: Option<u32>,
) -> Res<DevComm> {
    // SAFETY: forwarded contract.
    let mut asked = unsafe { read(r.cast(), headers)? };
    let comm = space.communicator();
    let (rank, n) = (comm.rank(), comm.nranks());
    let lsa_size = space.team.len();
    // The LSA barriers first: `(3 + lsaSize) * 4` bytes per barrier; then the hybrid
    // barriers' LSA part.
    let lsa_barrier_bytes = |count: u32| (3 + lsa_size) * 4 * count as usize;
    let (mut lsa_handle, mut hybrid_handle) = (0u32, 0u32);
    let mut place = vec![Resource::plain(
        lsa_barrier_bytes(asked.lsa_barriers),
        4,
        &mut lsa_handle,
    )];
    if asked.barriers > 0 {
        place.push(Resource::plain(
            lsa_barrier_bytes(asked.barriers),
            4,
            &mut hybrid_handle,
        ));
    }
    // GIN: signal ids, the user's first (NCCL promises they start at 0), then each GIN
    // barrier's, then each requirement's; the signal arrays and their shadows in the
    // resources (the signals where every rank's proxy can add to them).
    let mut ids = gin::Ids::default();
    let mut gin_values = layout::GinValues::default();
    let (mut signals_handle, mut shadows_handle) = (0u32, 0u32);
    let gin_ask = asked.gin.take();
    if let Some(g) = &gin_ask {
        ids.signals(g.user_signals)?;
        ids.counters(g.user_counters)?;
        gin_values.world = ids.signals(gin::barrier_signals(g.world, n))?;
        // The rail team: this rank's peers of the same LSA rank on every host.
        let rail = n / lsa_size.max(1);
        gin_values.rail = ids.signals(gin::barrier_signals(asked.rail, rail))?;
        gin_values.hybrid_dense = ids.signals(gin::barrier_signals(asked.barriers, n))?;
        gin_values.hybrid_rail = ids.signals(gin::barrier_signals(asked.barriers, rail))?;
        for res in &asked.resources {
            let (s, k, out_s, out_k) = res.gin;
            let (first_s, first_k) = (ids.signals(s)?, ids.counters(k)?);
            if !out_s.is_null() {
                // SAFETY: `outGinSignalStart` of the client's requirement, valid for a write.
                unsafe { out_s.write_unaligned(first_s) };
            }
            if !out_k.is_null() {
                // SAFETY: `outGinCounterStart`, as above.
                unsafe { out_k.write_unaligned(first_k) };
            }
        }
        let bytes = g.contexts * ids.signals as usize * 8;
        place.push(Resource::plain(bytes, 8, &mut signals_handle));
        place.push(Resource::plain(bytes, 8, &mut shadows_handle));
    }
    place.append(&mut asked.resources);
    let mut off = 0usize;
    let mut handles = Vec::with_capacity(place.len());
    for res in &place {
        off = off.next_multiple_of(res.align.max(RESOURCE_UNIT));
        let h = u32::try_from(off / RESOURCE_UNIT)
            .map_err(|_| Failure::argument("ncclDevCommCreate: resources beyond 2^32 units"))?;
        handles.push(h);
        off = off
            .checked_add(res.bytes)
            .ok_or_else(|| Failure::argument("ncclDevCommCreate: resources overflow"))?;
    }
    let total = off.next_multiple_of(RESOURCE_UNIT);
    // GIN without signals (puts and counters only) still needs its proxy, which lives with
    // the resources.
    let total = if gin_ask.is_some() {
        total.max(RESOURCE_UNIT)
    } else {
        total
    };
    let device = comm.device();
    let resources = if total > 0 {
        let sh = device
            .shareable()
            .ok_or_else(|| Failure::internal("a symmetric space without shareable memory"))?;
        let buf = sh.alloc(total)?;
        let stream = device.create_stream()?;
        stream.fill(&buf.full(), 0)?;
        stream.synchronize()?;
        let m = space
            .map(Some(&buf), 0, total, 0, 0, true)?
            .ok_or_else(|| Failure::internal("the resources were not mapped"))?;
        Some((m, buf))
    } else {
        None
    };
    for (res, &h) in place.iter().zip(&handles) {
        if !res.out.is_null() {
            // SAFETY: `outBufferHandle` of the client's requirement (or ours), valid for a write.
            unsafe { res.out.write_unaligned(h) };
        }
    }
    let gin = match (&gin_ask, &resources) {
        (Some(g), Some((m, _))) => {
            let at = |h: u32| h as usize * RESOURCE_UNIT;
            let shape = gin::Shape {
                contexts: g.contexts,
                queue: g.queue,
                signals: ids.signals as usize,
                counters: ids.counters as usize,
                ctx_stride: g.ctx_stride,
                signals_at: at(signals_handle),
            };
            let started = gin::Gin::start(space, shape, m.offset)?;
            gin_values.contexts_array = started.contexts.ptr().0;
            gin_values.contexts = g.contexts as u32;
            gin_values.signals = ids.signals;
            gin_values.counters = ids.counters;
            gin_values.shadows = space.flat(space.lsa_rank, m.offset + at(shadows_handle));
            gin_values.strong_legacy = g.strong_legacy;
            gin_values.abort_flag = started.abort.ptr().0;
            tracing::info!(
                target: crate::debug::INIT,
                "rank {rank}: GIN (proxy) with {} contexts of {} signals and {} counters, queues of {} slots",
                g.contexts,
                ids.signals,
                ids.counters,
                g.queue
            );
            Some(started)
        }
        _ => None,
    };
    // Every rank's resources are zeroed (and its proxy running) before any rank's kernel can
    // arrive at a barrier or signal it.
    comm.bootstrap().barrier()?;
    let (resource_window, resource) = match &resources {
        Some((m, _)) => (m.record.ptr().0, m.values),
        None => (0, Default::default()),
    };
    let values = DevCommValues {
        version: asked.version,
        rank: rank as u32,
        nranks: n as u32,
        lsa_rank: space.lsa_rank as u32,
        lsa_size: lsa_size as u32,
        window_table: space.table()?,
        resource_window,
        resource,
        lsa_barrier: (lsa_handle, asked.lsa_barriers),
        // With or without GIN (on one host the rail team is one rank, so the GIN part of a
        // hybrid barrier has no peer there).
        hybrid_lsa_barrier: (hybrid_handle, asked.barriers),
        gin: gin.is_some().then_some(gin_values),
    };
    let bytes = values.bytes(asked.layout);
    // SAFETY: the client's `ncclDevComm` of its version: `bytes.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len()) };
    Ok(DevComm { gin, resources })
}

/// The `resourceWindow` of the `ncclDevComm` at `d` (its layout told by its magic, as NCCL
/// tells it: 2.30+ start with the magic, earlier ones are read as 2.29's).
///
/// # Safety
/// `d` points to an `ncclDevComm` this library wrote.
pub unsafe fn resource_window(d: *const c_void) -> u64 {
    let d = d.cast::<u8>();
    // SAFETY: every layout is longer than 48 bytes (the caller's contract).
    unsafe {
        let magic = d.cast::<u32>().read_unaligned();
        let layout = if magic == layout::API_MAGIC {
            DevCommLayout::V2300
        } else {
            DevCommLayout::V22902
        };
        d.add(layout.offsets().resource_window)
            .cast::<u64>()
            .read_unaligned()
    }
}
