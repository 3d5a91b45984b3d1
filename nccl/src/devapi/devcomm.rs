//! `ncclDevCommCreate`/`ncclDevCommDestroy`: the requirements a client compiled read at its
//! version's offsets, the resources laid out in one symmetric buffer (zeroed; LSA barriers
//! first, then the client's own requirements, each at a 128-byte boundary as NCCL's handles
//! count), and the `ncclDevComm` written at the client's layout. What is not served — GIN,
//! multimem, CFT — is refused naming the field, before anything is allocated.

use std::ffi::c_void;

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

/// One resource to place: bytes, alignment, where its handle goes.
struct Resource {
    bytes: usize,
    align: usize,
    out: *mut u32,
}

/// A created device communicator: its resources, kept until destroyed.
#[derive(Debug)]
pub struct DevComm {
    /// The resource buffer's symmetric mapping (`None` without resources).
    pub resources: Option<(Mapped, mscclpp::hal::DeviceBuffer)>,
}

/// What the client's requirements ask for, read and checked.
struct Asked {
    version: u32,
    layout: DevCommLayout,
    lsa_barriers: u32,
    resources: Vec<Resource>,
}

/// Reads and checks `ncclDevCommRequirements` at `r`.
///
/// # Safety
/// `r` points to the client's requirements (at least its `size` bytes).
unsafe fn read(r: *const u8) -> Res<Asked> {
    // SAFETY: the header (16 bytes) exists in every versioned layout; `size` says the rest.
    let (size, magic, version) = unsafe {
        (
            r.cast::<u64>().read_unaligned() as usize,
            r.add(reqs::MAGIC).cast::<u32>().read_unaligned(),
            r.add(reqs::VERSION).cast::<u32>().read_unaligned(),
        )
    };
    if magic != layout::API_MAGIC {
        return Err(Failure::usage(format!(
            "ncclDevCommCreate: the requirements carry no NCCL_API_MAGIC (magic {magic:#x}): \
             made without NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER, or built against NCCL 2.28's \
             headers, whose unversioned device API neither this library nor NCCL >= 2.29 serves; \
             rebuild against NCCL 2.29.2 to 2.32.6"
        )));
    }
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
    if layout == DevCommLayout::V22902 {
        // 2.29.2/3: `barrierCount` asked for LSA barriers only (NCCL folds it in).
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
    let no_gin = |what: &str| {
        Failure::usage(format!(
            "ncclDevCommCreate: {what} asks for GIN (GPU-initiated networking), which this library does not serve yet: \
             ncclCommQueryProperties reports ginType NCCL_GIN_TYPE_NONE; LSA (load/store within the host) is served"
        ))
    };
    let gin_fields = [
        ("barrierCount", barriers),
        ("railGinBarrierCount", rail),
        ("ginSignalCount", get(reqs::GIN_SIGNAL_COUNT)),
        ("ginCounterCount", get(reqs::GIN_COUNTER_COUNT)),
        ("worldGinBarrierCount", get(reqs::WORLD_GIN_BARRIER_COUNT)),
        ("ginConnectionType", get(reqs::GIN_CONNECTION_TYPE)),
        ("ginCustomArrayCount", get(reqs::GIN_CUSTOM_ARRAY_COUNT)),
    ];
    if let Some((name, v)) = gin_fields.iter().find(|(_, v)| *v != 0) {
        return Err(no_gin(&format!("{name} {v}")));
    }
    if flag(reqs::GIN_FORCE_ENABLE) {
        return Err(no_gin("ginForceEnable"));
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
    let mut node = ptr(reqs::RESOURCE_LIST);
    while !node.is_null() {
        if resources.len() >= MAX_LIST {
            return Err(Failure::argument(
                "ncclDevCommCreate: resourceRequirementsList does not end",
            ));
        }
        use reqs::resource as f;
        // SAFETY: a node of the client's list (56 bytes from 2.28.7 on).
        let (next, bytes, align, out, signals, counters) = unsafe {
            (
                node.add(f::NEXT).cast::<*const u8>().read_unaligned(),
                node.add(f::BUFFER_SIZE).cast::<u64>().read_unaligned(),
                node.add(f::BUFFER_ALIGN).cast::<u64>().read_unaligned(),
                node.add(f::OUT_BUFFER_HANDLE)
                    .cast::<*mut u32>()
                    .read_unaligned(),
                node.add(f::GIN_SIGNAL_COUNT).cast::<i32>().read_unaligned(),
                node.add(f::GIN_COUNTER_COUNT)
                    .cast::<i32>()
                    .read_unaligned(),
            )
        };
        if signals != 0 || counters != 0 {
            return Err(no_gin(&format!(
                "a resource requirement of {signals} GIN signals and {counters} counters"
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
        resources.push(Resource { bytes, align, out });
        node = next;
    }
    Ok(Asked {
        version,
        layout,
        lsa_barriers: lsa as u32,
        resources,
    })
}

/// `ncclDevCommCreate` on `space`: collective over the communicator.
///
/// # Safety
/// `r` points to the client's requirements; `out` to an `ncclDevComm` of the client's version.
pub unsafe fn create(space: &Space, r: *const c_void, out: *mut c_void) -> Res<DevComm> {
    // SAFETY: forwarded contract.
    let mut asked = unsafe { read(r.cast())? };
    let lsa_size = space.team.len();
    // The LSA barriers first: `(3 + lsaSize) * 4` bytes per barrier.
    let mut lsa_handle = 0u32;
    let lsa_bytes = (3 + lsa_size) * 4 * asked.lsa_barriers as usize;
    let mut place = vec![Resource {
        bytes: lsa_bytes,
        align: 4,
        out: &mut lsa_handle,
    }];
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
    let comm = space.communicator();
    let device = comm.device();
    let resources = if total > 0 {
        let sh = device
            .shareable()
            .ok_or_else(|| Failure::internal("a symmetric space without shareable memory"))?;
        let buf = sh.alloc(total)?;
        let stream = device.create_stream()?;
        stream.fill(&buf.full(), 0)?;
        stream.synchronize()?;
        let m = space.map(Some(&buf), 0, total, 0, 0)?;
        Some((m, buf))
    } else {
        None
    };
    // Every rank's resources are zeroed before any rank's kernel can arrive at a barrier.
    comm.bootstrap().barrier()?;
    for (res, &h) in place.iter().zip(&handles) {
        if !res.out.is_null() {
            // SAFETY: `outBufferHandle` of the client's requirement (or ours), valid for a write.
            unsafe { res.out.write_unaligned(h) };
        }
    }
    let (resource_window, resource) = match &resources {
        Some((m, _)) => (m.record.ptr().0, m.values),
        None => (0, Default::default()),
    };
    let values = DevCommValues {
        version: asked.version,
        rank: comm.rank() as u32,
        nranks: comm.nranks() as u32,
        lsa_rank: space.lsa_rank as u32,
        lsa_size: lsa_size as u32,
        window_table: space.table()?,
        resource_window,
        resource,
        lsa_barrier: (lsa_handle, asked.lsa_barriers),
    };
    let bytes = values.bytes(asked.layout);
    // SAFETY: the client's `ncclDevComm` of its version: `bytes.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len()) };
    Ok(DevComm { resources })
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
