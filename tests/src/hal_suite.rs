//! HAL conformance cases, written once for every backend.

use std::time::{Duration, Instant};

use mscclpp::hal::api::{Api, DeviceApi, EventApi, GraphApi, StreamApi, typed_device};
use mscclpp::hal::{
    BackendKind, BufferSlice, Device, DevicePtr, ErrorClass, IpcHandle, KernelId, LaunchConfig,
    MemoryKind, MulticastAddress, MulticastSupport, Stream, TypedKernel,
};

use crate::ensure;
use crate::harness::{CaseError, CaseFn, Context, Fixture, hex, skipped, unhex};
use crate::kernels::{ATOMIC_ADD_U64, AtomicAddU64Args, FILL_U32, FillU32Args, MODULE};
use crate::multiproc;
use crate::rng::Rng;

/// Every case, in the order they are listed.
pub const CASES: &[(&str, CaseFn)] = &[
    (
        "devices_enumerate_with_properties",
        devices_enumerate_with_properties,
    ),
    (
        "peer_matrix_is_square_and_reflexive",
        peer_matrix_is_square_and_reflexive,
    ),
    ("alloc_rejects_zero_bytes", alloc_rejects_zero_bytes),
    (
        "host_round_trip_every_memory_kind",
        host_round_trip_every_memory_kind,
    ),
    ("slices_are_bounds_checked", slices_are_bounds_checked),
    (
        "allocation_range_names_the_allocation",
        allocation_range_names_the_allocation,
    ),
    (
        "ranges_across_several_mappings_are_served",
        ranges_across_several_mappings_are_served,
    ),
    (
        "shareable_memory_maps_at_chosen_offsets",
        shareable_memory_maps_at_chosen_offsets,
    ),
    (
        "copy_between_buffers_with_offsets",
        copy_between_buffers_with_offsets,
    ),
    ("fill_sets_every_byte", fill_sets_every_byte),
    (
        "write_value64_is_ordered_and_checked",
        write_value64_is_ordered_and_checked,
    ),
    (
        "wait_value64_holds_the_stream_until_the_flag",
        wait_value64_holds_the_stream_until_the_flag,
    ),
    (
        "mismatched_lengths_are_errors",
        mismatched_lengths_are_errors,
    ),
    ("stream_runs_work_in_order", stream_runs_work_in_order),
    (
        "buffer_outlives_handle_while_queued",
        buffer_outlives_handle_while_queued,
    ),
    ("events_record_query_and_time", events_record_query_and_time),
    (
        "stream_waits_for_event_of_another",
        stream_waits_for_event_of_another,
    ),
    ("ipc_export_import_in_process", ipc_export_import_in_process),
    (
        "ipc_rejects_foreign_and_malformed_handles",
        ipc_rejects_foreign_and_malformed_handles,
    ),
    ("ipc_across_processes", ipc_across_processes),
    ("ipc_import_after_free_fails", ipc_import_after_free_fails),
    ("ipc_of_wrapped_memory", ipc_of_wrapped_memory),
    ("kernel_fill_u32", kernel_fill_u32),
    (
        "kernel_atomics_from_every_thread",
        kernel_atomics_from_every_thread,
    ),
    (
        "kernel_unknown_id_and_bad_shape_are_errors",
        kernel_unknown_id_and_bad_shape_are_errors,
    ),
    ("graph_capture_replays_work", graph_capture_replays_work),
    (
        "typed_api_reaches_the_backend_types",
        typed_api_reaches_the_backend_types,
    ),
    (
        "multicast_group_binds_and_maps",
        multicast_group_binds_and_maps,
    ),
    ("multicast_rejects_bad_binds", multicast_rejects_bad_binds),
];

/// The cases that run with no other case at the same time ([`crate::harness::stamp`]): this one
/// holds a stream on a flag that its own thread releases with a driver call.
pub const ALONE: &[&str] = &["wait_value64_holds_the_stream_until_the_flag"];

const SYNC: Duration = Duration::from_secs(60);

fn seeded() -> (Rng, u64) {
    Rng::from_time()
}

fn upload(s: &dyn Stream, dst: &BufferSlice, data: &[u8]) -> Result<(), String> {
    s.write_from_host(dst, data).ctx("write_from_host")
}

fn download(s: &dyn Stream, src: &BufferSlice) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; src.len()];
    s.read_to_host(&mut out, src).ctx("read_to_host")?;
    Ok(out)
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or(if a.len() == b.len() {
            None
        } else {
            Some(a.len().min(b.len()))
        })
}

fn devices_enumerate_with_properties(f: &Fixture) -> Result<(), CaseError> {
    let n = f.backend.device_count();
    ensure!(n > 0, "backend reports no devices but probed successfully");
    for i in 0..n {
        let info = f.backend.device_info(i).ctx("device_info")?;
        ensure!(
            info.ordinal == i,
            "device {i} reports ordinal {}",
            info.ordinal
        );
        ensure!(
            info.backend == f.backend.kind(),
            "device {i} of another backend"
        );
        ensure!(
            !info.arch.is_empty() && !info.name.is_empty(),
            "empty name or arch"
        );
        ensure!(
            info.max_threads_per_block > 0 && info.warp_size > 0,
            "zero limits: {info:?}"
        );
    }
    let e = f
        .backend
        .device_info(n)
        .err()
        .ok_or("device_info(count) succeeded")?;
    ensure!(
        e.class() == ErrorClass::InvalidUsage,
        "wrong class for a bad ordinal: {e}"
    );
    ensure!(
        e.to_string().contains(&n.to_string()),
        "error does not name the count: {e}"
    );
    ensure!(!f.backend.describe().is_empty(), "empty description");
    Ok(())
}

fn peer_matrix_is_square_and_reflexive(f: &Fixture) -> Result<(), CaseError> {
    let m = f.backend.peer_access().ctx("peer_access")?;
    ensure!(
        m.len() == f.backend.device_count(),
        "matrix of {} for {} devices",
        m.len(),
        f.backend.device_count()
    );
    for i in 0..m.len() {
        ensure!(m.can_access(i, i), "device {i} cannot access itself");
    }
    ensure!(!m.can_access(m.len(), 0), "out-of-range access reported");
    Ok(())
}

fn alloc_rejects_zero_bytes(f: &Fixture) -> Result<(), CaseError> {
    let e = f
        .device
        .alloc(0, MemoryKind::Device)
        .err()
        .ok_or("alloc(0) succeeded")?;
    ensure!(e.class() == ErrorClass::InvalidUsage, "wrong class: {e}");
    Ok(())
}

fn host_round_trip_every_memory_kind(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let (mut rng, seed) = seeded();
    for kind in [
        MemoryKind::Device,
        MemoryKind::HostMapped,
        MemoryKind::Uncached,
    ] {
        for len in [1usize, 7, 4096, 1 << 20] {
            let buf = f.device.alloc(len, kind).ctx("alloc")?;
            ensure!(
                buf.len() == len && buf.kind() == kind,
                "alloc returned {buf:?}"
            );
            let data = rng.bytes(len);
            upload(&*s, &buf.full(), &data)?;
            let back = download(&*s, &buf.full())?;
            ensure!(
                back == data,
                "{kind:?} {len} B: first difference at {:?} (seed {seed})",
                first_difference(&back, &data)
            );
        }
    }
    Ok(())
}

/// Every address inside an allocation of the device names that allocation (the caller side
/// keeps it, and wraps later ranges inside it without asking again); memory the device did not
/// make names none.
fn allocation_range_names_the_allocation(f: &Fixture) -> Result<(), CaseError> {
    let len = (1 << 20) + 12345;
    for kind in [MemoryKind::Device, MemoryKind::Uncached] {
        let buf = f.device.alloc(len, kind).ctx("alloc")?;
        let base = buf.ptr();
        for off in [0, 1, 4096, len / 2, len - 1] {
            let got = f
                .device
                .allocation_range(base.offset(off))
                .ctx("allocation_range")?;
            ensure!(
                matches!(got, Some((b, l)) if b == base && l >= len),
                "{kind:?}: {off} bytes into {len} at {base:?}: {got:?}"
            );
        }
    }
    let foreign = vec![0u8; 4096];
    let got = f
        .device
        .allocation_range(DevicePtr(foreign.as_ptr() as u64 + 64))
        .ctx("allocation_range of foreign memory")?;
    ensure!(got.is_none(), "memory of the process's heap named {got:?}");
    Ok(())
}

/// Symmetric memory's base (`Device::shareable`): two shareable allocations, exported as file
/// descriptors and mapped into one reserved range at offsets of our choosing, each a second
/// view of its allocation (data written through one is read through the other, by copies on
/// the device); an overlapping mapping and one past the range are refused. Skipped where the
/// backend has no shareable memory.
fn shareable_memory_maps_at_chosen_offsets(f: &Fixture) -> Result<(), CaseError> {
    let Some(sh) = f.device.shareable() else {
        return Err(skipped(format!(
            "the {} backend has no shareable memory",
            f.backend.kind()
        )));
    };
    let g = sh.granularity();
    let (a, b) = (
        sh.alloc(g + 1).ctx("shareable alloc")?,
        sh.alloc(g).ctx("shareable alloc")?,
    );
    ensure!(
        a.len() == 2 * g && b.len() == g,
        "lengths {} and {} for granularity {g}",
        a.len(),
        b.len()
    );
    let space = sh.reserve(8 * g).ctx("reserve")?;
    let (fa, fb) = (sh.export(&a).ctx("export")?, sh.export(&b).ctx("export")?);
    use std::os::fd::AsFd;
    space.map(g, fa.as_fd(), a.len()).ctx("map a")?;
    space.map(5 * g, fb.as_fd(), b.len()).ctx("map b")?;
    ensure!(
        space.map(2 * g, fb.as_fd(), g).is_err(),
        "a mapping over another was accepted"
    );
    ensure!(
        space.map(7 * g, fa.as_fd(), 2 * g).is_err(),
        "a mapping past the range was accepted"
    );
    // SAFETY: the views lie in mappings of `space`, which outlives them and every operation
    // enqueued with them (this function synchronises before returning).
    let (va, vb) = unsafe {
        (
            f.device
                .wrap_external(space.base().offset(g), a.len())
                .ctx("wrap a's view")?,
            f.device
                .wrap_external(space.base().offset(5 * g), g)
                .ctx("wrap b's view")?,
        )
    };
    let s = f.device.create_stream().ctx("create_stream")?;
    let (da, db) = (seeded().0.bytes(a.len()), seeded().0.bytes(g));
    upload(&*s, &a.full(), &da)?;
    upload(&*s, &vb.full(), &db)?;
    ensure!(
        download(&*s, &va.full())? == da,
        "a's view does not hold a's bytes"
    );
    ensure!(
        download(&*s, &b.full())? == db,
        "bytes written through b's view are not b's"
    );
    drop((va, vb));
    space.unmap(5 * g, g).ctx("unmap")?;
    ensure!(
        space.unmap(5 * g, g).is_err(),
        "a second unmap was accepted"
    );
    Ok(())
}

/// A virtual-memory allocator's range (PyTorch's expandable segments): several mappings back
/// to back, which the device names one at a time. A caller's range that starts inside one and
/// ends inside another is wrapped and carries data across the boundaries; a range running past
/// the last mapping is refused, naming where the mapped memory stops (GPU backends: the host
/// backend takes any caller memory).
fn ranges_across_several_mappings_are_served(f: &Fixture) -> Result<(), CaseError> {
    let pieces = match f.device.alloc_pieces(64 << 10, 4) {
        Ok(b) => b,
        Err(e) if e.class() == ErrorClass::Unavailable => return Err(skipped(e)),
        Err(e) => return Err(format!("alloc_pieces: {e}").into()),
    };
    let base = pieces.ptr();
    let (first, piece) = f
        .device
        .allocation_range(base)
        .ctx("allocation_range")?
        .ok_or("the first mapping is not named")?;
    ensure!(
        first == base && piece * 4 == pieces.len(),
        "the first of 4 mappings of a {}-byte range is {piece} bytes at {first:?}",
        pieces.len()
    );
    let second = f
        .device
        .allocation_range(base.offset(piece + 1))
        .ctx("allocation_range")?;
    ensure!(
        second == Some((base.offset(piece), piece)),
        "the second mapping is named {second:?}"
    );
    // Inside the first mapping, through the second, into the third.
    let (start, len) = (base.offset(100), 2 * piece);
    // SAFETY: the range lies in `pieces`, which outlives the view and every operation enqueued
    // with it (this function synchronises before returning).
    let view =
        unsafe { f.device.wrap_external(start, len) }.ctx("wrap_external across mappings")?;
    let s = f.device.create_stream().ctx("create_stream")?;
    let data = seeded().0.bytes(len);
    upload(&*s, &view.full(), &data)?;
    let plain = f.device.alloc(len, MemoryKind::Device).ctx("alloc")?;
    s.copy(&plain.full(), &view.full()).ctx("copy")?;
    let back = download(&*s, &plain.full())?;
    ensure!(back == data, "bytes across the mappings came back changed");
    if f.backend.kind() != BackendKind::Host {
        // SAFETY: refused before any use.
        let past = unsafe { f.device.wrap_external(base.offset(3 * piece + 8), piece) };
        let e = past
            .err()
            .ok_or("a range past the last mapping was wrapped")?;
        ensure!(
            e.class() == ErrorClass::InvalidUsage && e.to_string().contains("nothing at"),
            "wrong refusal: {e}"
        );
        // No single IPC handle names several mappings: the wrapped range is refused saying so.
        let e = f
            .device
            .ipc_export(&view)
            .err()
            .ok_or("a wrapped range of several mappings was exported as one handle")?;
        ensure!(
            e.to_string().contains("spans 3 mappings"),
            "wrong refusal of the wrapped range: {e}"
        );
    }
    // Nor the whole range, on any backend.
    let e = f
        .device
        .ipc_export(&pieces)
        .err()
        .ok_or("a range of several mappings was exported as one handle")?;
    ensure!(
        e.class() == ErrorClass::InvalidUsage && e.to_string().contains("several mappings"),
        "wrong refusal of the range: {e}"
    );
    Ok(())
}

fn slices_are_bounds_checked(f: &Fixture) -> Result<(), CaseError> {
    let buf = f.device.alloc(100, MemoryKind::Device).ctx("alloc")?;
    ensure!(
        buf.slice(0..100).is_ok() && buf.slice(100..100).is_ok(),
        "valid slices refused"
    );
    for bad in [
        buf.slice(0..101),
        buf.slice(std::ops::Range { start: 60, end: 50 }),
        buf.slice(101..),
    ] {
        let e = bad.err().ok_or("out-of-range slice accepted")?;
        ensure!(
            e.class() == ErrorClass::InvalidUsage && e.to_string().contains("100 bytes"),
            "unclear error: {e}"
        );
    }
    let s = buf.slice(10..60).ctx("slice")?;
    ensure!(
        s.ptr().0 == buf.ptr().0 + 10 && s.len() == 50,
        "slice arithmetic wrong"
    );
    ensure!(
        s.slice(0..51).is_err(),
        "sub-slice beyond the slice accepted"
    );
    ensure!(
        s.slice(40..50).ctx("sub-slice")?.ptr().0 == buf.ptr().0 + 50,
        "sub-slice arithmetic wrong"
    );
    Ok(())
}

fn copy_between_buffers_with_offsets(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let (mut rng, seed) = seeded();
    let (a, b) = (
        f.device.alloc(1 << 16, MemoryKind::Device).ctx("alloc")?,
        f.device.alloc(1 << 16, MemoryKind::Device).ctx("alloc")?,
    );
    let src = rng.bytes(1 << 16);
    upload(&*s, &a.full(), &src)?;
    upload(&*s, &b.full(), &vec![0xA5; 1 << 16])?; // poison
    for _ in 0..16 {
        let len = rng.below(8192) as usize + 1;
        let so = rng.below((1 << 16) - len as u64) as usize;
        let dst_off = rng.below((1 << 16) - len as u64) as usize;
        s.copy(
            &b.slice(dst_off..dst_off + len).ctx("slice")?,
            &a.slice(so..so + len).ctx("slice")?,
        )
        .ctx("copy")?;
        s.synchronize_timeout(SYNC).ctx("synchronize")?;
        let got = download(&*s, &b.slice(dst_off..dst_off + len).ctx("slice")?)?;
        ensure!(
            got == src[so..so + len],
            "copy {so}->{dst_off} len {len} wrong (seed {seed})"
        );
    }
    Ok(())
}

fn fill_sets_every_byte(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let buf = f.device.alloc(12345, MemoryKind::Device).ctx("alloc")?;
    upload(&*s, &buf.full(), &vec![1; 12345])?;
    s.fill(&buf.slice(100..12000).ctx("slice")?, 0x5C)
        .ctx("fill")?;
    let got = download(&*s, &buf.full())?;
    ensure!(
        got[..100].iter().all(|&x| x == 1),
        "fill wrote before its range"
    );
    ensure!(
        got[100..12000].iter().all(|&x| x == 0x5C),
        "fill missed bytes"
    );
    ensure!(
        got[12000..].iter().all(|&x| x == 1),
        "fill wrote after its range"
    );
    Ok(())
}

fn write_value64_is_ordered_and_checked(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let buf = f.device.alloc(64, MemoryKind::Device).ctx("alloc")?;
    s.fill(&buf.full(), 0).ctx("fill")?;
    s.write_value64(&buf.slice(8..16).ctx("slice")?, 0x0123_4567_89AB_CDEF)
        .ctx("write_value64")?;
    s.fill(&buf.slice(16..24).ctx("slice")?, 0xFF).ctx("fill")?;
    s.write_value64(&buf.slice(16..24).ctx("slice")?, 42)
        .ctx("write_value64")?;
    let got = download(&*s, &buf.full())?;
    ensure!(
        got[8..16] == 0x0123_4567_89AB_CDEFu64.to_le_bytes(),
        "value not stored"
    );
    ensure!(
        got[16..24] == 42u64.to_le_bytes(),
        "store not ordered after the fill before it"
    );
    ensure!(
        got[..8].iter().chain(&got[24..]).all(|&b| b == 0),
        "store spilled"
    );
    for bad in [buf.slice(4..12), buf.slice(8..12)] {
        let bad = bad.ctx("slice")?;
        ensure!(
            s.write_value64(&bad, 1).is_err(),
            "misaligned or short write_value64 accepted"
        );
    }
    Ok(())
}

/// Writes 3 into a flag on drop (errors ignored: the case has failed already when it matters).
struct ReleaseFlag<'a> {
    stream: &'a dyn Stream,
    flag: &'a BufferSlice,
}

impl Drop for ReleaseFlag<'_> {
    fn drop(&mut self) {
        let _ = self.stream.write_value64(self.flag, 3);
        let _ = self.stream.synchronize_timeout(SYNC);
    }
}

/// A stream waiting on a flag runs nothing behind the wait until another stream writes the
/// flag (`>=` and `==`), then everything; misaligned and short flags are refused.
fn wait_value64_holds_the_stream_until_the_flag(f: &Fixture) -> Result<(), CaseError> {
    use mscclpp::hal::WaitCmp;
    let waiter = f.device.create_stream().ctx("create_stream")?;
    let writer = f.device.create_stream().ctx("create_stream")?;
    let buf = f.device.alloc(64, MemoryKind::Device).ctx("alloc")?;
    waiter.fill(&buf.full(), 0).ctx("fill")?;
    waiter.synchronize_timeout(SYNC).ctx("synchronize")?;
    let flag = buf.slice(0..8).ctx("slice")?;
    let data = buf.slice(32..40).ctx("slice")?;
    waiter
        .wait_value64(&flag, 2, WaitCmp::Geq)
        .ctx("wait_value64")?;
    waiter.fill(&data, 0x11).ctx("fill")?;
    waiter
        .wait_value64(&flag, 3, WaitCmp::Eq)
        .ctx("wait_value64")?;
    waiter.fill(&data, 0x22).ctx("fill")?;
    // Whatever path the case leaves by (an error below returns early), the flag ends at 3, so
    // that no stream of this process is left waiting on the device for ever.
    let _release = ReleaseFlag {
        stream: &*writer,
        flag: &flag,
    };
    // 1 satisfies neither wait: nothing behind them may run.
    writer.write_value64(&flag, 1).ctx("write_value64")?;
    writer.synchronize_timeout(SYNC).ctx("synchronize")?;
    std::thread::sleep(Duration::from_millis(100));
    let early = download(&*writer, &data)?;
    // Released before any check can return, so that no stream is left waiting.
    writer.write_value64(&flag, 3).ctx("write_value64")?;
    ensure!(
        early == [0; 8],
        "work behind a wait ran before the flag reached its value"
    );
    writer.synchronize_timeout(SYNC).ctx("synchronize")?;
    waiter
        .synchronize_timeout(SYNC)
        .ctx("synchronize after the flag")?;
    ensure!(
        download(&*waiter, &data)? == [0x22; 8],
        "work behind the waits did not run once the flag allowed it"
    );
    for bad in [buf.slice(4..12), buf.slice(8..12)] {
        let bad = bad.ctx("slice")?;
        ensure!(
            waiter.wait_value64(&bad, 1, WaitCmp::Eq).is_err(),
            "misaligned or short wait_value64 accepted"
        );
    }
    Ok(())
}

fn mismatched_lengths_are_errors(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let (a, b) = (
        f.device.alloc(64, MemoryKind::Device).ctx("alloc")?,
        f.device.alloc(32, MemoryKind::Device).ctx("alloc")?,
    );
    let e = s
        .copy(&a.full(), &b.full())
        .err()
        .ok_or("copy of unequal lengths accepted")?;
    ensure!(
        e.class() == ErrorClass::InvalidUsage
            && e.to_string().contains("32")
            && e.to_string().contains("64"),
        "unclear: {e}"
    );
    ensure!(
        s.write_from_host(&a.full(), &[0; 3]).is_err(),
        "short host write accepted"
    );
    ensure!(
        s.read_to_host(&mut [0; 3], &a.full()).is_err(),
        "short host read accepted"
    );
    Ok(())
}

fn stream_runs_work_in_order(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let len = 1 << 20;
    let (a, b) = (
        f.device.alloc(len, MemoryKind::Device).ctx("alloc")?,
        f.device.alloc(len, MemoryKind::Device).ctx("alloc")?,
    );
    for round in 0..20u8 {
        s.fill(&a.full(), round).ctx("fill")?;
        s.copy(&b.full(), &a.full()).ctx("copy")?;
        s.fill(&a.full(), round.wrapping_add(100)).ctx("fill")?;
    }
    s.synchronize_timeout(SYNC).ctx("synchronize")?;
    let got = download(&*s, &b.full())?;
    ensure!(
        got.iter().all(|&x| x == 19),
        "copy did not see the fill before it (or saw the one after)"
    );
    Ok(())
}

fn buffer_outlives_handle_while_queued(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let keep = f.device.alloc(1 << 20, MemoryKind::Device).ctx("alloc")?;
    for _ in 0..8 {
        let tmp = f.device.alloc(1 << 20, MemoryKind::Device).ctx("alloc")?;
        s.fill(&tmp.full(), 7).ctx("fill")?;
        s.copy(&keep.full(), &tmp.full()).ctx("copy")?;
        drop(tmp); // the stream must keep the memory alive until the copy ran
    }
    let got = download(&*s, &keep.full())?;
    ensure!(
        got.iter().all(|&x| x == 7),
        "copy from a dropped-while-queued buffer lost data"
    );
    Ok(())
}

fn events_record_query_and_time(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let (e0, e1) = (
        f.device.create_event().ctx("create_event")?,
        f.device.create_event().ctx("create_event")?,
    );
    ensure!(
        e0.query().ctx("query")?,
        "a never-recorded event must count as reached"
    );
    let buf = f.device.alloc(16 << 20, MemoryKind::Device).ctx("alloc")?;
    s.record(&*e0).ctx("record")?;
    for i in 0..8 {
        s.fill(&buf.full(), i).ctx("fill")?;
    }
    s.record(&*e1).ctx("record")?;
    e1.synchronize_timeout(SYNC).ctx("event synchronize")?;
    ensure!(
        e1.query().ctx("query")?,
        "event not reached after synchronize"
    );
    let ms = e1.elapsed_ms_since(&*e0).ctx("elapsed")?;
    ensure!(
        (0.0..60_000.0).contains(&ms),
        "implausible elapsed time {ms} ms"
    );
    Ok(())
}

fn stream_waits_for_event_of_another(f: &Fixture) -> Result<(), CaseError> {
    let (s1, s2) = (
        f.device.create_stream().ctx("create_stream")?,
        f.device.create_stream().ctx("create_stream")?,
    );
    let ev = f.device.create_event().ctx("create_event")?;
    let len = 32 << 20;
    let (a, b) = (
        f.device.alloc(len, MemoryKind::Device).ctx("alloc")?,
        f.device.alloc(len, MemoryKind::Device).ctx("alloc")?,
    );
    s2.fill(&b.full(), 0).ctx("fill")?;
    s2.synchronize_timeout(SYNC).ctx("synchronize")?;
    for i in 1..=10u8 {
        s1.fill(&a.full(), i).ctx("fill")?;
    }
    s1.record(&*ev).ctx("record")?;
    s2.wait_event(&*ev).ctx("wait_event")?;
    s2.copy(&b.full(), &a.full()).ctx("copy")?;
    s2.synchronize_timeout(SYNC).ctx("synchronize")?;
    let got = download(&*s2, &b.full())?;
    ensure!(
        got.iter().all(|&x| x == 10),
        "second stream ran before the event it waited for"
    );
    Ok(())
}

fn ipc_export_import_in_process(f: &Fixture) -> Result<(), CaseError> {
    if !f.device.info().caps.ipc {
        return Err(skipped("the device has no IPC"));
    }
    let s = f.device.create_stream().ctx("create_stream")?;
    let buf = f.device.alloc(1 << 16, MemoryKind::Device).ctx("alloc")?;
    let handle = f.device.ipc_export(&buf).ctx("ipc_export")?;
    let decoded = IpcHandle::from_bytes(&handle.to_bytes()).ctx("decode handle")?;
    let peer = f.device.ipc_import(&decoded).ctx("ipc_import")?;
    ensure!(
        peer.len() == buf.len(),
        "imported {} bytes of {}",
        peer.len(),
        buf.len()
    );
    let (mut rng, seed) = seeded();
    let data = rng.bytes(1 << 16);
    upload(&*s, &peer.full(), &data)?;
    ensure!(
        download(&*s, &buf.full())? == data,
        "write through the import not seen by the original (seed {seed})"
    );
    let e = f
        .device
        .ipc_export(&peer)
        .err()
        .ok_or("exporting an imported mapping succeeded")?;
    ensure!(e.class() == ErrorClass::InvalidUsage, "wrong class: {e}");
    Ok(())
}

fn ipc_rejects_foreign_and_malformed_handles(f: &Fixture) -> Result<(), CaseError> {
    let buf = f.device.alloc(4096, MemoryKind::Device).ctx("alloc")?;
    let mut h = f.device.ipc_export(&buf).ctx("ipc_export")?;
    let mut bytes = h.to_bytes();
    bytes.truncate(bytes.len() - 1);
    ensure!(
        IpcHandle::from_bytes(&bytes).is_err(),
        "truncated handle decoded"
    );
    let mut garbage = h.clone();
    garbage.payload = vec![0xEE; garbage.payload.len()];
    ensure!(
        f.device.ipc_import(&garbage).is_err(),
        "garbage payload imported"
    );
    let other = mscclpp::hal::BackendKind::ALL
        .into_iter()
        .find(|k| *k != f.backend.kind())
        .ok_or("no other backend kind")?;
    h.backend = other;
    let e = f
        .device
        .ipc_import(&h)
        .err()
        .ok_or("handle of another backend imported")?;
    ensure!(
        e.to_string().contains(other.name()),
        "error does not name the foreign backend: {e}"
    );
    drop(buf);
    Ok(())
}

fn ipc_import_after_free_fails(f: &Fixture) -> Result<(), CaseError> {
    let buf = f.device.alloc(8192, MemoryKind::Device).ctx("alloc")?;
    let handle = f.device.ipc_export(&buf).ctx("ipc_export")?;
    drop(buf);
    // Allocate again so that a reused slot (descriptor, address) would be tempting to map.
    let _other = f.device.alloc(8192, MemoryKind::Device).ctx("alloc")?;
    let e = f
        .device
        .ipc_import(&handle)
        .err()
        .ok_or("handle of freed memory imported")?;
    ensure!(
        e.class() != ErrorClass::Internal,
        "internal error for a stale handle: {e}"
    );
    Ok(())
}

/// Child role of [`ipc_across_processes`].
pub const IPC_CHILD_ROLE: &str = "hal-ipc-child";

fn ipc_across_processes(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let len = 4 << 20;
    let buf = f.device.alloc(len, MemoryKind::Device).ctx("alloc")?;
    let seed = seeded().1;
    let mut rng = Rng::new(seed);
    let mine = rng.bytes(len / 2);
    let theirs = rng.bytes(len / 2);
    upload(&*s, &buf.slice(..len / 2).ctx("slice")?, &mine)?;
    s.fill(&buf.slice(len / 2..).ctx("slice")?, 0xA5)
        .ctx("poison")?;
    s.synchronize_timeout(SYNC).ctx("synchronize")?;
    let handle = f.device.ipc_export(&buf).ctx("ipc_export")?;
    let env = vec![
        (
            "MSCCLPP_BACKEND".to_string(),
            f.backend.kind().name().to_string(),
        ),
        ("MSCCLPP_TEST_HANDLE".to_string(), hex(&handle.to_bytes())),
        ("MSCCLPP_TEST_SEED".to_string(), seed.to_string()),
    ];
    let child = multiproc::wait(
        multiproc::spawn(IPC_CHILD_ROLE, 1, 2, &env),
        Instant::now() + SYNC,
    );
    ensure!(child.ok(), "child failed:\n{}", child.describe());
    ensure!(
        child.reports().get("read_parent").map(String::as_str) == Some("ok"),
        "child did not see the parent's data:\n{}",
        child.describe()
    );
    let got = download(&*s, &buf.slice(len / 2..).ctx("slice")?)?;
    ensure!(
        got == theirs,
        "parent does not see the child's write: first difference at {:?} (seed {seed})",
        first_difference(&got, &theirs)
    );
    Ok(())
}

/// Memory the caller owns (a PyTorch tensor: a piece of one of its allocator's segments),
/// wrapped, exported and mapped by another process: the importer sees exactly the wrapped
/// bytes, at their offset in the allocation, and writes nothing outside them. The host backend
/// maps only its own allocations and must say so.
fn ipc_of_wrapped_memory(f: &Fixture) -> Result<(), CaseError> {
    if !f.device.info().caps.ipc {
        return Err(skipped("the device has no IPC"));
    }
    let s = f.device.create_stream().ctx("create_stream")?;
    let (pad, len) = (64 << 10, 2 << 20);
    let buf = f
        .device
        .alloc(pad + len + pad, MemoryKind::Device)
        .ctx("alloc")?;
    s.fill(&buf.full(), 0x5A).ctx("poison")?;
    // SAFETY: `buf` outlives the view and every operation enqueued with it (this function
    // synchronises before returning).
    let view = unsafe {
        f.device
            .wrap_external(DevicePtr(buf.ptr().0 + pad as u64), len)
    }
    .ctx("wrap_external")?;
    if f.backend.kind() == BackendKind::Host {
        let e = f
            .device
            .ipc_export(&view)
            .err()
            .ok_or("the host backend exported memory it did not allocate")?;
        ensure!(e.class() == ErrorClass::InvalidUsage, "wrong class: {e}");
        return Ok(());
    }
    let seed = seeded().1;
    let mut rng = Rng::new(seed);
    let mine = rng.bytes(len / 2);
    let theirs = rng.bytes(len / 2);
    upload(&*s, &view.slice(..len / 2).ctx("slice")?, &mine)?;
    let handle = f
        .device
        .ipc_export(&view)
        .ctx("ipc_export of wrapped memory")?;
    let again = f.device.ipc_export(&view).ctx("second ipc_export")?;
    ensure!(
        again.to_bytes() == handle.to_bytes(),
        "two exports of one wrapped range differ (the allocation's id must be stable)"
    );
    let here = f
        .device
        .ipc_import(&IpcHandle::from_bytes(&handle.to_bytes()).ctx("decode")?)
        .ctx("ipc_import in the exporting process")?;
    ensure!(
        here.len() == len && here.ptr() == view.ptr(),
        "in-process import is {} bytes at {:?}, not {len} at {:?}",
        here.len(),
        here.ptr(),
        view.ptr()
    );
    let env = vec![
        (
            "MSCCLPP_BACKEND".to_string(),
            f.backend.kind().name().to_string(),
        ),
        ("MSCCLPP_TEST_HANDLE".to_string(), hex(&handle.to_bytes())),
        ("MSCCLPP_TEST_SEED".to_string(), seed.to_string()),
    ];
    let child = multiproc::wait(
        multiproc::spawn(IPC_CHILD_ROLE, 1, 2, &env),
        Instant::now() + SYNC,
    );
    ensure!(child.ok(), "child failed:\n{}", child.describe());
    ensure!(
        child.reports().get("read_parent").map(String::as_str) == Some("ok"),
        "child did not see the wrapped bytes:\n{}",
        child.describe()
    );
    let got = download(&*s, &view.slice(len / 2..).ctx("slice")?)?;
    ensure!(
        got == theirs,
        "the child's write did not land in the wrapped range: first difference at {:?} (seed {seed})",
        first_difference(&got, &theirs)
    );
    for (what, range) in [("before", 0..pad), ("after", pad + len..pad + len + pad)] {
        let outside = download(&*s, &buf.slice(range).ctx("slice")?)?;
        ensure!(
            outside.iter().all(|&b| b == 0x5A),
            "bytes {what} the wrapped range were written"
        );
    }
    drop((here, view));
    Ok(())
}

/// The child side of [`ipc_across_processes`]; returns the exit code.
pub fn ipc_child() -> i32 {
    let run = || -> Result<(), String> {
        let backend = mscclpp::registry::select().ctx("select backend")?;
        let device: std::sync::Arc<dyn Device> = backend.open_device(0).ctx("open_device")?;
        let s = device.create_stream().ctx("create_stream")?;
        let bytes = std::env::var("MSCCLPP_TEST_HANDLE")
            .ok()
            .and_then(|h| unhex(&h))
            .ok_or("no handle")?;
        let seed: u64 = std::env::var("MSCCLPP_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("no seed")?;
        let handle = IpcHandle::from_bytes(&bytes).ctx("decode")?;
        let buf = device.ipc_import(&handle).ctx("ipc_import")?;
        let len = buf.len();
        let mut rng = Rng::new(seed);
        let parent = rng.bytes(len / 2);
        let mine = rng.bytes(len / 2);
        let got = download(&*s, &buf.slice(..len / 2).ctx("slice")?)?;
        ensure!(
            got == parent,
            "child reads something else than the parent wrote"
        );
        multiproc::report("read_parent", "ok");
        upload(&*s, &buf.slice(len / 2..).ctx("slice")?, &mine)?;
        s.synchronize_timeout(SYNC).ctx("synchronize")?;
        Ok(())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ipc child: {e}");
            1
        }
    }
}

fn kernel_fill_u32(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let k = f.device.load(&MODULE, FILL_U32).ctx("load")?;
    let count = 100_003usize; // not a multiple of any block shape
    let buf = f
        .device
        .alloc(count * 4 + 8, MemoryKind::Device)
        .ctx("alloc")?;
    s.fill(&buf.full(), 0xFF).ctx("poison")?;
    let args = FillU32Args {
        dst: buf.ptr().0 + 4,
        count: count as u64,
        value: 0xC0FFEE,
        _pad: 0,
    };
    // SAFETY: `dst` addresses `count` words inside `buf`, which lives past the synchronize.
    unsafe { s.launch(&*k, LaunchConfig::linear(7, 128), &args) }.ctx("launch")?;
    s.synchronize_timeout(SYNC).ctx("synchronize")?;
    let got = download(&*s, &buf.full())?;
    let words: Vec<u32> = got
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    ensure!(
        words[0] == u32::MAX && words[count + 1] == u32::MAX,
        "kernel wrote outside its range"
    );
    let wrong = words[1..=count].iter().filter(|&&w| w != 0xC0FFEE).count();
    ensure!(wrong == 0, "{wrong} of {count} words not filled");
    Ok(())
}

fn kernel_atomics_from_every_thread(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let k = f.device.load(&MODULE, ATOMIC_ADD_U64).ctx("load")?;
    let buf = f.device.alloc(8, MemoryKind::Device).ctx("alloc")?;
    s.fill(&buf.full(), 0).ctx("fill")?;
    let args = AtomicAddU64Args {
        counter: buf.ptr().0,
        value: 3,
    };
    let cfg = LaunchConfig::linear(16, 256);
    for _ in 0..4 {
        // SAFETY: `counter` is the 8-byte buffer above, alive past the synchronize.
        unsafe { s.launch(&*k, cfg, &args) }.ctx("launch")?;
    }
    s.synchronize_timeout(SYNC).ctx("synchronize")?;
    let got = u64::from_le_bytes(
        download(&*s, &buf.full())?
            .try_into()
            .map_err(|_| "8 bytes")?,
    );
    ensure!(
        got == 4 * 16 * 256 * 3,
        "counter {got}, expected {} (lost atomic updates)",
        4 * 16 * 256 * 3
    );
    Ok(())
}

fn kernel_unknown_id_and_bad_shape_are_errors(f: &Fixture) -> Result<(), CaseError> {
    let e = f
        .device
        .load(&MODULE, KernelId("no_such_kernel"))
        .err()
        .ok_or("unknown kernel loaded")?;
    ensure!(
        e.to_string().contains("no_such_kernel"),
        "error does not name the kernel: {e}"
    );
    let s = f.device.create_stream().ctx("create_stream")?;
    let k = f.device.load(&MODULE, FILL_U32).ctx("load")?;
    let buf = f.device.alloc(64, MemoryKind::Device).ctx("alloc")?;
    let args = FillU32Args {
        dst: buf.ptr().0,
        count: 16,
        value: 1,
        _pad: 0,
    };
    let too_big = LaunchConfig::linear(1, f.device.info().max_threads_per_block + 1);
    // SAFETY: the launch is refused before it runs; were it to run, the args are valid.
    let e = unsafe { s.launch(&*k, too_big, &args) }
        .err()
        .ok_or("oversized block accepted")?;
    ensure!(e.class() == ErrorClass::InvalidUsage, "wrong class: {e}");
    // SAFETY: as above.
    let e = unsafe { s.launch_raw(&*k, LaunchConfig::linear(1, 1), &[0u8; 3]) };
    let e = match e {
        Err(e) => e,
        Ok(()) => s
            .synchronize_timeout(SYNC)
            .err()
            .ok_or("3-byte argument struct accepted")?,
    };
    ensure!(
        e.to_string().contains("3 bytes"),
        "error does not name the size: {e}"
    );
    Ok(())
}

/// The typed HAL (`mscclpp::hal::api`) on the backend's own types, from the device the registry
/// opened: a kernel launched, events recorded and timed, a capture replayed, all without a
/// trait object between the stream and what it is handed.
fn typed_api_reaches_the_backend_types(f: &Fixture) -> Result<(), CaseError> {
    match f.device.info().backend {
        BackendKind::Host => typed_case::<mscclpp::host::Host>(f),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => typed_case::<mscclpp::cuda::Cuda>(f),
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => typed_case::<mscclpp::rocm::Rocm>(f),
        #[allow(unreachable_patterns)]
        other => Err(skipped(format!("the {other} backend is not built in"))),
    }
}

fn typed_case<A: Api>(f: &Fixture) -> Result<(), CaseError> {
    let device = typed_device::<A>(&f.device).ctx("typed_device")?;
    let s = DeviceApi::create_stream(&*device).ctx("create_stream")?;
    let (start, end) = (
        DeviceApi::create_event(&*device).ctx("create_event")?,
        DeviceApi::create_event(&*device).ctx("create_event")?,
    );
    let fill = TypedKernel::<FillU32Args, A>::load(&device, &MODULE, FILL_U32).ctx("load")?;
    let add =
        TypedKernel::<AtomicAddU64Args, A>::load(&device, &MODULE, ATOMIC_ADD_U64).ctx("load")?;
    let count = 4099usize;
    let buf = f.device.alloc(count * 4, MemoryKind::Device).ctx("alloc")?;
    let counter = f.device.alloc(8, MemoryKind::Device).ctx("alloc")?;
    StreamApi::fill(&*s, &buf.full(), 0xFF).ctx("poison")?;
    StreamApi::fill(&*s, &counter.full(), 0).ctx("fill")?;
    StreamApi::record(&*s, &*start).ctx("record")?;
    let args = FillU32Args {
        dst: buf.ptr().0,
        count: count as u64,
        value: 0x5EED,
        _pad: 0,
    };
    // SAFETY: `dst` addresses `count` words of `buf`, alive past the synchronize.
    unsafe { fill.launch(&s, LaunchConfig::linear(5, 128), &args) }.ctx("launch")?;
    StreamApi::record(&*s, &*end).ctx("record")?;
    StreamApi::synchronize_timeout(&*s, SYNC).ctx("synchronize")?;
    let ms = EventApi::elapsed_ms_since(&*end, &start).ctx("elapsed")?;
    ensure!(
        ms.is_finite() && ms.is_sign_positive(),
        "elapsed time {ms} ms between two reached events"
    );
    let mut got = vec![0u8; count * 4];
    StreamApi::read_to_host(&*s, &mut got, &buf.full()).ctx("read")?;
    let wrong = got
        .chunks_exact(4)
        .filter(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) != 0x5EED)
        .count();
    ensure!(wrong == 0, "{wrong} of {count} words not filled");

    let add_args = AtomicAddU64Args {
        counter: counter.ptr().0,
        value: 2,
    };
    match StreamApi::begin_capture(&*s) {
        Err(e) if e.class() == ErrorClass::Unavailable => return Ok(()),
        r => r.ctx("begin_capture")?,
    }
    // SAFETY: the counter lives past the synchronize (the graph keeps it alive too).
    let launched = unsafe { add.launch(&s, LaunchConfig::linear(2, 64), &add_args) };
    // The capture ends whatever the launch gave, so that the stream is not left capturing.
    let graph = StreamApi::end_capture(&*s).ctx("end_capture");
    launched.ctx("launch while capturing")?;
    let graph = graph?;
    for _ in 0..3 {
        GraphApi::launch(&*graph, &s).ctx("replay")?;
    }
    StreamApi::synchronize_timeout(&*s, SYNC).ctx("synchronize")?;
    let mut word = [0u8; 8];
    StreamApi::read_to_host(&*s, &mut word, &counter.full()).ctx("read")?;
    let n = u64::from_le_bytes(word);
    ensure!(
        n == 3 * 2 * 64 * 2,
        "after 3 replays the counter is {n}, expected 768"
    );
    Ok(())
}

fn graph_capture_replays_work(f: &Fixture) -> Result<(), CaseError> {
    let s = f.device.create_stream().ctx("create_stream")?;
    let k = f.device.load(&MODULE, ATOMIC_ADD_U64).ctx("load")?;
    let counter = f.device.alloc(8, MemoryKind::Device).ctx("alloc")?;
    let marker = f.device.alloc(4096, MemoryKind::Device).ctx("alloc")?;
    s.fill(&counter.full(), 0).ctx("fill")?;
    s.synchronize_timeout(SYNC).ctx("synchronize")?;
    match s.begin_capture() {
        Err(e) if e.class() == ErrorClass::Unavailable => {
            return Err(skipped(format!("no graph capture here: {e}")));
        }
        Err(e) => return Err(format!("begin_capture: {e}").into()),
        Ok(()) => {}
    }
    let args = AtomicAddU64Args {
        counter: counter.ptr().0,
        value: 5,
    };
    // SAFETY: the counter lives past the synchronize below (the graph also keeps it alive).
    unsafe { s.launch(&*k, LaunchConfig::linear(2, 32), &args) }.ctx("launch while capturing")?;
    s.fill(&marker.full(), 0x3C).ctx("fill while capturing")?;
    let refused = s.synchronize_timeout(SYNC).is_err();
    let graph = s.end_capture().ctx("end_capture")?;
    ensure!(refused, "synchronize while capturing was accepted");
    // Nothing ran at capture time.
    let before = u64::from_le_bytes(
        download(&*s, &counter.full())?
            .try_into()
            .map_err(|_| "8 bytes")?,
    );
    ensure!(
        before == 0,
        "captured work ran at capture time (counter {before})"
    );
    for _ in 0..3 {
        graph.launch(&*s).ctx("graph launch")?;
    }
    s.synchronize_timeout(SYNC).ctx("synchronize")?;
    let after = u64::from_le_bytes(
        download(&*s, &counter.full())?
            .try_into()
            .map_err(|_| "8 bytes")?,
    );
    ensure!(
        after == 3 * 2 * 32 * 5,
        "after 3 replays the counter is {after}, expected {}",
        3 * 2 * 32 * 5
    );
    ensure!(
        download(&*s, &marker.full())?.iter().all(|&b| b == 0x3C),
        "captured fill did not run"
    );
    ensure!(
        s.end_capture().is_err(),
        "end_capture without a capture accepted"
    );
    Ok(())
}

fn multicast_group_binds_and_maps(f: &Fixture) -> Result<(), CaseError> {
    let granularity = match &f.device.info().caps.multicast {
        MulticastSupport::Unsupported(reason) => {
            let e = f
                .device
                .multicast_create(1 << 21, 2)
                .err()
                .ok_or("multicast created although unsupported")?;
            ensure!(
                e.class() == ErrorClass::Unavailable,
                "wrong class when unsupported ({reason}): {e}"
            );
            return Ok(());
        }
        MulticastSupport::Hardware { granularity } | MulticastSupport::Emulated { granularity } => {
            *granularity
        }
    };
    let s = f.device.create_stream().ctx("create_stream")?;
    let size = granularity * 2;
    let group = f.device.multicast_create(size, 2).ctx("multicast_create")?;
    let other = f
        .device
        .multicast_import(&group.export().ctx("export")?)
        .ctx("multicast_import")?;
    ensure!(
        other.size() == size && other.num_members() == 2,
        "imported group differs"
    );
    let (a, b) = (
        f.device.alloc(size, MemoryKind::Device).ctx("alloc")?,
        f.device
            .alloc(size + 4096, MemoryKind::Device)
            .ctx("alloc")?,
    );
    upload(&*s, &a.full(), &vec![1; size])?;
    upload(&*s, &b.full(), &vec![2; size + 4096])?;
    group.bind(0, &a.full()).ctx("bind 0")?;
    other
        .bind(1, &b.slice(4096..).ctx("slice")?)
        .ctx("bind 1")?;
    let m0 = group.map(SYNC).ctx("map")?;
    let m1 = other.map(SYNC).ctx("map")?;
    match (&m0.address, &m1.address) {
        (MulticastAddress::Emulated(p0), MulticastAddress::Emulated(p1)) => {
            ensure!(p0.len() == 2 && p1.len() == 2, "mapping lacks members");
            // Through the mapping each member's memory is visible: read member 1 via map 0.
            upload(&*s, &b.slice(4096..4096 + 4).ctx("slice")?, &[9, 9, 9, 9])?;
            // SAFETY: p0[1] maps member 1's `size` bytes, kept alive by `m0`.
            let seen = unsafe { std::slice::from_raw_parts(p0[1].0 as *const u8, 4) }.to_vec();
            ensure!(
                seen == [9, 9, 9, 9],
                "member 1's write not visible through member 0's mapping"
            );
            // SAFETY: p1[0] maps member 0's `size` bytes, kept alive by `m1`.
            let seen = unsafe { std::slice::from_raw_parts(p1[0].0 as *const u8, 4) }.to_vec();
            ensure!(
                seen == [1, 1, 1, 1],
                "member 0's memory not visible through member 1's mapping"
            );
        }
        (MulticastAddress::Hardware(_), MulticastAddress::Hardware(_)) => {}
        other => return Err(format!("mixed mapping kinds: {other:?}").into()),
    }
    Ok(())
}

fn multicast_rejects_bad_binds(f: &Fixture) -> Result<(), CaseError> {
    let granularity = match &f.device.info().caps.multicast {
        MulticastSupport::Unsupported(reason) => {
            return Err(skipped(format!("multicast unsupported: {reason}")));
        }
        MulticastSupport::Hardware { granularity } | MulticastSupport::Emulated { granularity } => {
            *granularity
        }
    };
    ensure!(
        f.device.multicast_create(granularity + 1, 2).is_err(),
        "size off the granularity accepted"
    );
    ensure!(
        f.device.multicast_create(granularity, 0).is_err(),
        "group of no members accepted"
    );
    let g = f
        .device
        .multicast_create(granularity, 2)
        .ctx("multicast_create")?;
    let buf = f
        .device
        .alloc(granularity, MemoryKind::Device)
        .ctx("alloc")?;
    ensure!(g.bind(2, &buf.full()).is_err(), "member out of range bound");
    ensure!(
        g.bind(0, &buf.slice(..granularity / 2).ctx("slice")?)
            .is_err(),
        "short buffer bound"
    );
    g.bind(0, &buf.full()).ctx("bind")?;
    let e = g.bind(0, &buf.full()).err().ok_or("double bind accepted")?;
    ensure!(e.to_string().contains("already bound"), "unclear: {e}");
    let e = g
        .map(Duration::from_millis(100))
        .err()
        .ok_or("map succeeded with a member missing")?;
    ensure!(
        e.class() == ErrorClass::Timeout && e.to_string().contains("member 1"),
        "unclear: {e}"
    );
    Ok(())
}
