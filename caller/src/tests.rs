//! The caller side on the host backend: its rules (streams, sizes, one rank) and plan staging
//! with 2 ranks in threads, every result checked against a CPU reference.

use std::sync::Arc;

use mscclpp_collectives::{CollectiveCall, CollectiveKind, P2pKind, P2pOp};
use mscclpp_comm::Communicator;
use mscclpp_comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot};
use std::sync::atomic::{AtomicUsize, Ordering};

use mscclpp_hal::{
    Backend, BufferSlice, DataType, Device, DeviceBuffer, DeviceInfo, DevicePtr, Event, IpcHandle,
    Kernel, KernelId, KernelModule, LaunchConfig, MemoryKind, MulticastGroup, ReduceOp,
    Result as HalResult, Stream,
};

use super::{Caller, buffer_bytes};

/// `n` callers of one communicator, one per thread, each running `f(rank, caller)`.
fn with_ranks<T: Send>(n: usize, f: impl Fn(usize, &Caller) -> T + Sync) -> Vec<T> {
    with_ranks_on(n, |d| d, |r, c| f(r, &c.expect("caller")))
}

/// As [`with_ranks`], each rank's host device passed through `device` first, and `f` given what
/// making the caller returned.
fn with_ranks_on<T: Send>(
    n: usize,
    device: impl Fn(Arc<dyn Device>) -> Arc<dyn Device> + Sync,
    f: impl Fn(usize, HalResult<Caller>) -> T + Sync,
) -> Vec<T> {
    let cfg = BootstrapConfig::default();
    let (_root, uid) =
        BootstrapRoot::start("127.0.0.1:0".parse().expect("addr"), n, &cfg).expect("root");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (uid, cfg, f, wrap) = (uid, cfg.clone(), &f, &device);
                s.spawn(move || {
                    let boot = Arc::new(Bootstrap::new(&uid, r, n, cfg).expect("bootstrap"));
                    let device = wrap(
                        mscclpp_host::HostBackend::new()
                            .open_device(0)
                            .expect("host device"),
                    );
                    f(r, Caller::new(Arc::new(Communicator::new(boot, device))))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn write_f32(b: &DeviceBuffer, v: &[f32]) {
    let p = b.full().host_ptr().expect("host memory").cast::<f32>();
    // SAFETY: `b` holds at least `v.len()` floats of host memory; no call uses it now.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p, v.len()) };
}

fn read_f32(b: &DeviceBuffer, n: usize) -> Vec<f32> {
    let p = b.full().host_ptr().expect("host memory").cast::<f32>();
    // SAFETY: as above; the call has run (host backend).
    unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
}

#[test]
fn sizes_follow_the_collective_and_refuse_overflow() {
    let f = DataType::F32;
    assert_eq!(
        buffer_bytes(CollectiveKind::AllReduce, 10, f, 4).unwrap(),
        (40, 40)
    );
    assert_eq!(
        buffer_bytes(CollectiveKind::AllGather, 10, f, 4).unwrap(),
        (40, 160)
    );
    assert_eq!(
        buffer_bytes(CollectiveKind::ReduceScatter, 10, f, 4).unwrap(),
        (160, 40)
    );
    assert_eq!(
        buffer_bytes(CollectiveKind::AllToAll, 10, f, 4).unwrap(),
        (160, 160)
    );
    let e = buffer_bytes(CollectiveKind::AllGather, usize::MAX / 2, f, 4).unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
}

/// One rank: a named stream is refused on the host backend, none runs on the communicator's
/// own; collectives are copies (nothing in place); sends to itself land in its receives, and a
/// send without its receive is refused.
#[test]
fn one_rank_copies_and_the_host_stream_rule() {
    with_ranks(1, |_, c| {
        assert!(c.serves() && !c.has_collectives() && c.is_host());
        let Err(e) = c.stream(Some(0x1234)) else {
            panic!("a named stream was accepted on the host backend");
        };
        assert!(e.to_string().contains("no native streams"), "{e}");
        let s = c.stream(None).expect("own stream");
        assert!(Arc::ptr_eq(&s, c.internal()));
        let dev = c.communicator().device();
        let (a, b) = (
            dev.alloc(64, MemoryKind::Device).unwrap(),
            dev.alloc(64, MemoryKind::Device).unwrap(),
        );
        let x: Vec<f32> = (0..16).map(|i| i as f32 * 1.5 - 3.0).collect();
        write_f32(&a, &x);
        write_f32(&b, &[f32::NAN; 16]);
        let (ia, ob) = (a.full(), b.full());
        let call = CollectiveCall::new(CollectiveKind::AllReduce, &ia, &ob, 16, DataType::F32)
            .op(ReduceOp::Max);
        c.collective(&call, &*s).expect("one-rank all-reduce");
        assert_eq!(read_f32(&b, 16), x);
        write_f32(&b, &[f32::NAN; 16]);
        let ops = [
            P2pOp {
                kind: P2pKind::Send,
                peer: 0,
                buffer: &ia,
                bytes: 64,
            },
            P2pOp {
                kind: P2pKind::Recv,
                peer: 0,
                buffer: &ob,
                bytes: 64,
            },
        ];
        c.send_recv(&ops, &*s).expect("send to itself");
        assert_eq!(read_f32(&b, 16), x);
        let e = c.send_recv(&ops[..1], &*s).unwrap_err();
        assert!(e.to_string().contains("each send needs its receive"), "{e}");
    });
}

/// A stream of no backend's: every call on it is refused by the collectives' type check.
#[derive(Debug)]
struct ForeignStream;

impl Stream for ForeignStream {
    fn copy(&self, _: &BufferSlice, _: &BufferSlice) -> HalResult<()> {
        Ok(())
    }
    fn fill(&self, _: &BufferSlice, _: u8) -> HalResult<()> {
        Ok(())
    }
    fn write_value64(&self, _: &BufferSlice, _: u64) -> HalResult<()> {
        Ok(())
    }
    fn write_from_host(&self, _: &BufferSlice, _: &[u8]) -> HalResult<()> {
        Ok(())
    }
    fn read_to_host(&self, _: &mut [u8], _: &BufferSlice) -> HalResult<()> {
        Ok(())
    }
    unsafe fn launch_raw(&self, _: &dyn Kernel, _: LaunchConfig, _: &[u8]) -> HalResult<()> {
        Ok(())
    }
    fn record(&self, _: &dyn Event) -> HalResult<()> {
        Ok(())
    }
    fn wait_event(&self, _: &dyn Event) -> HalResult<()> {
        Ok(())
    }
    fn synchronize_timeout(&self, _: std::time::Duration) -> HalResult<()> {
        Ok(())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Two ranks: the front ends' collectives run on the host backend's own types (the erasure
/// point, `typed_collectives`), correct against a CPU reference; a stream that is not the
/// backend's is refused with an error naming the backend, before anything is enqueued.
#[test]
fn the_collectives_run_on_the_backends_own_types_and_refuse_a_foreign_stream() {
    with_ranks(2, |r, c| {
        let guard = c.colls();
        let colls = guard
            .as_deref()
            .expect("two ranks of one host have collectives");
        assert_eq!(colls.backend(), "host");
        let dev = c.communicator().device();
        let (a, b) = (
            dev.alloc(4096, MemoryKind::Device).unwrap(),
            dev.alloc(4096, MemoryKind::Device).unwrap(),
        );
        let x =
            |rank: usize| -> Vec<f32> { (0..1024).map(|i| (i * 3 + rank * 7) as f32).collect() };
        write_f32(&a, &x(r));
        write_f32(&b, &[f32::NAN; 1024]);
        let (ia, ob) = (a.full(), b.full());
        let call = CollectiveCall::new(CollectiveKind::AllReduce, &ia, &ob, 1024, DataType::F32);
        let s = c.stream(None).expect("own stream");
        c.collective(&call, &*s).expect("all-reduce");
        let want: Vec<f32> = (0..1024).map(|i| x(0)[i] + x(1)[i]).collect();
        assert_eq!(read_f32(&b, 1024), want);
        let foreign: Arc<dyn Stream> = Arc::new(ForeignStream);
        let e = c.collective(&call, &*foreign).unwrap_err();
        assert!(
            e.to_string()
                .contains("a stream of another backend was handed to the host backend"),
            "{e}"
        );
        let e = colls.ordered(&*foreign, || Ok(())).unwrap_err();
        assert!(e.to_string().contains("another backend"), "{e}");
        let ran = colls
            .ordered(&*s, || Ok(7))
            .expect("ordered on the own stream");
        assert_eq!(ran, 7);
    });
}

/// A device that reports the host backend but wraps it (its type is not the backend's): the
/// collectives run on a backend's own types only, so the caller refuses it at creation, on every
/// rank, naming the backend and why (no rank waits for a peer that gave up).
#[test]
fn a_wrapped_device_is_refused_naming_its_backend() {
    let wrap = |inner: Arc<dyn Device>| -> Arc<dyn Device> {
        Arc::new(CountingWraps {
            inner,
            wraps: AtomicUsize::new(0),
            ranges: AtomicUsize::new(0),
        })
    };
    let errors = with_ranks_on(2, wrap, |_, c| match c {
        Ok(_) => "created".to_string(),
        Err(e) => e.to_string(),
    });
    for e in errors {
        assert!(
            e.contains("host backend") && e.contains("wrapper"),
            "refused naming the backend and why: {e}"
        );
    }
}

/// An in-place plan given two distinct buffers, and an out-of-place plan given one: both
/// correct (the plan runs on staged buffers arranged as it says), on 2 ranks, 3 runs each with
/// fresh data and the output poisoned first; the input of the distinct pair is left as it was.
#[test]
fn plans_serve_in_place_and_out_of_place_calls_alike() {
    let n = 2;
    let count = 4096;
    let results = with_ranks(n, |r, c| {
        let dev = c.communicator().device();
        let s = c.stream(None).expect("stream");
        let mut wrong = Vec::new();
        for inplace_plan in [true, false] {
            let v = mscclpp_executor::testgen::allreduce_simple(n, inplace_plan);
            let plan = mscclpp_executor::Plan::from_value(&v, n).expect("plan");
            for run in 0..3 {
                let input = |p: usize| -> Vec<f32> {
                    (0..count)
                        .map(|i| ((i * 7 + p * 13 + run * 3) % 31) as f32 - 15.0)
                        .collect()
                };
                let want: Vec<f32> = (0..count)
                    .map(|i| (0..n).map(|p| input(p)[i]).sum())
                    .collect();
                // Distinct buffers.
                let (a, b) = (
                    dev.alloc(count * 4, MemoryKind::Device).unwrap(),
                    dev.alloc(count * 4, MemoryKind::Device).unwrap(),
                );
                write_f32(&a, &input(r));
                write_f32(&b, &vec![f32::NAN; count]);
                let ran = c
                    .run_plan(&plan, &a.full(), &b.full(), DataType::F32, None, &*s)
                    .expect("plan on distinct buffers");
                assert!(ran);
                if read_f32(&b, count) != want {
                    wrong.push(format!(
                        "in-place plan {inplace_plan}, distinct buffers, run {run}"
                    ));
                }
                if read_f32(&a, count) != input(r) {
                    wrong.push(format!(
                        "in-place plan {inplace_plan}: the input changed, run {run}"
                    ));
                }
                // One buffer.
                write_f32(&a, &input(r));
                c.run_plan(&plan, &a.full(), &a.full(), DataType::F32, None, &*s)
                    .expect("plan in place");
                if read_f32(&a, count) != want {
                    wrong.push(format!(
                        "in-place plan {inplace_plan}, one buffer, run {run}"
                    ));
                }
            }
        }
        wrong
    });
    for (r, w) in results.iter().enumerate() {
        assert!(w.is_empty(), "rank {r}: {w:?}");
    }
}

/// Tests that free (`memory_freed`) or count what a free clears run one at a time: the free
/// counter is the process's.
static FREES_SEEN: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn caller_memory_is_wrapped_once_per_range_and_forgotten_after_a_free() {
    let _one = FREES_SEEN.lock().unwrap_or_else(|p| p.into_inner());
    with_ranks(1, |_, caller| {
        let device = caller.communicator().device().clone();
        let mem = device.alloc(64 * 1024, MemoryKind::Device).expect("memory");
        let base = mem.ptr().0;
        let same = |a: &DeviceBuffer, b: &DeviceBuffer| Arc::ptr_eq(a.allocation(), b.allocation());
        // SAFETY: `mem` outlives every wrapper made here; nothing runs on them.
        let w = |off: u64, len: usize| unsafe { caller.wrap(base + off, len) }.expect("wrap");
        let a = w(0, 4096);
        assert!(
            same(&a, &w(0, 4096)),
            "the same range wraps to the kept wrapper"
        );
        assert!(!same(&a, &w(0, 2048)), "another length is another wrapper");
        assert_eq!(caller.memory.len(), 2);
        // More ranges than it keeps: bounded, the least recently used goes first.
        let _ = w(0, 4096);
        for i in 1..=super::memory::WRAP_CACHE_ENTRIES as u64 {
            let _ = w(i * 16, 16);
        }
        assert_eq!(caller.memory.len(), super::memory::WRAP_CACHE_ENTRIES);
        let b = w(16 * super::memory::WRAP_CACHE_ENTRIES as u64, 16);
        assert!(same(
            &b,
            &w(16 * super::memory::WRAP_CACHE_ENTRIES as u64, 16)
        ));
        // A free the library sees drops every wrapper.
        super::memory_freed();
        assert!(!same(
            &b,
            &w(16 * super::memory::WRAP_CACHE_ENTRIES as u64, 16)
        ));
        assert_eq!(caller.memory.len(), 1);
        // Refusals are not kept: a null range fails every time.
        for _ in 0..2 {
            // SAFETY: refused before any use.
            assert!(unsafe { caller.wrap(0, 16) }.is_err());
        }
    });
}

/// An in-place call's input and output are one slice of one wrapper; other pairs are two
/// slices, each of exactly its range, whether of a kept wrapper or of a kept allocation.
#[test]
fn a_call_in_place_wraps_one_range() {
    with_ranks(1, |_, caller| {
        let device = caller.communicator().device().clone();
        let mem = device.alloc(8192, MemoryKind::Device).expect("memory");
        let base = mem.ptr().0;
        let same = |a: &BufferSlice, b: &BufferSlice| {
            Arc::ptr_eq(a.buffer().allocation(), b.buffer().allocation())
                && a.offset() == b.offset()
        };
        let range = |s: &BufferSlice| (s.ptr().0, s.len());
        // SAFETY: `mem` outlives every wrapper made here; nothing runs on them.
        let pair = |i: (u64, usize), o: (u64, usize)| unsafe { caller.wrap_pair(i, o) }.unwrap();
        let (i, o) = pair((base, 4096), (base, 4096));
        assert!(same(&i, &o), "in place: one wrapper");
        assert_eq!(range(&i), (base, 4096));
        let (i, o) = pair((base, 4096), (base + 4096, 4096));
        assert!(!same(&i, &o));
        assert_eq!((range(&i), range(&o)), ((base, 4096), (base + 4096, 4096)));
        let (i, o) = pair((base, 4096), (base, 8192));
        assert!(!same(&i, &o), "same start, other length");
        assert_eq!((range(&i), range(&o)), ((base, 4096), (base, 8192)));
        // Out of place into the allocation's tail: a slice of the kept allocation.
        let (_, o) = pair((base, 16), (base + 8176, 16));
        assert_eq!(range(&o), (base + 8176, 16));
        // SAFETY: refused before any use.
        assert!(unsafe { caller.wrap_pair((base, 16), (0, 16)) }.is_err());
    });
}

/// The host device, counting the ranges it is asked to wrap (as a GPU backend asks its driver
/// about each).
#[derive(Debug)]
struct CountingWraps {
    inner: Arc<dyn Device>,
    wraps: AtomicUsize,
    ranges: AtomicUsize,
}

impl Device for CountingWraps {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn alloc(&self, bytes: usize, kind: MemoryKind) -> HalResult<DeviceBuffer> {
        self.inner.alloc(bytes, kind)
    }
    fn create_stream(&self) -> HalResult<Arc<dyn Stream>> {
        self.inner.create_stream()
    }
    fn create_event(&self) -> HalResult<Arc<dyn Event>> {
        self.inner.create_event()
    }
    fn ipc_export(&self, buf: &DeviceBuffer) -> HalResult<IpcHandle> {
        self.inner.ipc_export(buf)
    }
    fn ipc_import(&self, handle: &IpcHandle) -> HalResult<DeviceBuffer> {
        self.inner.ipc_import(handle)
    }
    fn multicast_create(&self, bytes: usize, members: usize) -> HalResult<Arc<dyn MulticastGroup>> {
        self.inner.multicast_create(bytes, members)
    }
    fn multicast_import(&self, handle: &IpcHandle) -> HalResult<Arc<dyn MulticastGroup>> {
        self.inner.multicast_import(handle)
    }
    fn load(&self, module: &'static KernelModule, id: KernelId) -> HalResult<Arc<dyn Kernel>> {
        self.inner.load(module, id)
    }
    unsafe fn wrap_external(&self, ptr: DevicePtr, len: usize) -> HalResult<DeviceBuffer> {
        self.wraps.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { self.inner.wrap_external(ptr, len) }
    }
    fn allocation_range(&self, ptr: DevicePtr) -> HalResult<Option<(DevicePtr, usize)>> {
        self.ranges.fetch_add(1, Ordering::Relaxed);
        self.inner.allocation_range(ptr)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

/// nccl-tests moves its buffers on every iteration, and a caching allocator hands out tensors
/// inside a few segments: new ranges inside an allocation the device named once are wrapped
/// without asking it again; ranges outside, or past its end, are asked about. Each question is
/// a driver query on a GPU: (allocation ranges asked, ranges wrapped by the device).
#[test]
fn ranges_inside_a_known_allocation_are_wrapped_without_asking_the_device_again() {
    let _one = FREES_SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let device = CountingWraps {
        inner: mscclpp_host::HostBackend::new()
            .open_device(0)
            .expect("host device"),
        wraps: AtomicUsize::new(0),
        ranges: AtomicUsize::new(0),
    };
    let asked = || {
        (
            device.ranges.load(Ordering::Relaxed),
            device.wraps.load(Ordering::Relaxed),
        )
    };
    let cache = super::memory::WrapCache::from_env().expect("cache");
    let mem = device.alloc(1 << 20, MemoryKind::Device).expect("memory");
    let base = mem.ptr().0;
    // SAFETY: `mem` (and `foreign`) outlive every wrapper made here; nothing runs on them.
    let w = |ptr: u64, len: usize| unsafe { cache.wrap(&device, ptr, len) }.expect("wrap");
    // SAFETY: as above.
    let sl = |ptr: u64, len: usize| unsafe { cache.wrap_slice(&device, ptr, len) }.expect("slice");
    // The first range: its allocation named once, which is the check.
    let first = w(base, 4096);
    assert_eq!((asked(), cache.allocations()), ((1, 0), 1));
    assert_eq!((first.ptr().0, first.len()), (base, 4096));
    // More distinct ranges than the cache keeps wrappers for, as nccl-tests' small sizes pass,
    // as slices (a call's) and as buffers of exactly the range (a registration's).
    for i in 0..4 * super::memory::WRAP_CACHE_ENTRIES as u64 {
        let (ptr, len) = (base + 8 * i, 8 + i as usize);
        let s = sl(ptr, len);
        assert_eq!((s.ptr().0, s.len()), (ptr, len));
        let b = w(ptr + 1, len);
        assert_eq!((b.ptr().0, b.len()), (ptr + 1, len));
    }
    assert_eq!(
        asked(),
        (1, 0),
        "ranges inside the allocation asked the device again"
    );
    // The last byte is inside; one more is not: the device is asked what is mapped after the
    // allocation (another mapping may happen to follow it, which then holds the rest).
    let _ = sl(base + (1 << 20) - 16, 16);
    assert_eq!(asked(), (1, 0));
    let neighbour = device
        .inner
        .allocation_range(DevicePtr(base + (1 << 20)))
        .expect("allocation range")
        .is_some();
    let past = w(base + (1 << 20) - 16, 17);
    let (after, allocations) = if neighbour { ((3, 0), 2) } else { ((3, 1), 1) };
    assert_eq!(
        (past.len(), asked(), cache.allocations()),
        (17, after, allocations)
    );
    // Memory the device did not map is asked about every time (no allocation is named).
    let foreign = vec![0u8; 4096];
    let f = foreign.as_ptr() as u64;
    let _ = sl(f, 64);
    let _ = w(f + 64, 64);
    assert_eq!(
        (asked(), cache.allocations()),
        ((after.0 + 2, after.1 + 2), allocations)
    );
    // An empty range is the device's to refuse, every time, and learns nothing.
    for _ in 0..2 {
        // SAFETY: as above.
        let _ = unsafe { cache.wrap_slice(&device, base, 0) };
    }
    assert_eq!(asked(), (after.0 + 2, after.1 + 4));
    // A free the library sees forgets the allocations too.
    super::memory_freed();
    let _ = sl(base + 4096, 4096);
    assert_eq!(
        (asked(), cache.allocations()),
        ((after.0 + 3, after.1 + 4), 1)
    );
    drop(mem);
}

/// A virtual-memory allocator's range (PyTorch's expandable segments): one range made of
/// several mappings, each named by the device as its own allocation. A call on a range that
/// starts inside one mapping and ends inside another is served, and the whole run of mappings
/// is learnt once (one question per mapping), so later ranges inside it ask nothing.
#[test]
fn ranges_across_several_mappings_are_one_memory() {
    let _one = FREES_SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let device = CountingWraps {
        inner: mscclpp_host::HostBackend::new()
            .open_device(0)
            .expect("host device"),
        wraps: AtomicUsize::new(0),
        ranges: AtomicUsize::new(0),
    };
    let mem = device.inner.alloc_pieces(4096, 4).expect("pieces");
    let base = mem.ptr().0;
    // The device names one piece at a time.
    assert_eq!(
        device.allocation_range(DevicePtr(base + 4096 + 5)).unwrap(),
        Some((DevicePtr(base + 4096), 4096))
    );
    device.ranges.store(0, Ordering::Relaxed);
    let cache = super::memory::WrapCache::from_env().expect("cache");
    // SAFETY: `mem` outlives every wrapper made here; nothing runs on them.
    let sl = |ptr: u64, len: usize| unsafe { cache.wrap_slice(&device, ptr, len) };
    // Inside the first piece, through the second, into the third.
    let s = sl(base + 100, 3 * 4096).expect("a range over three mappings");
    assert_eq!((s.ptr().0, s.len()), (base + 100, 3 * 4096));
    assert_eq!(
        device.ranges.load(Ordering::Relaxed),
        4,
        "one question per mapping"
    );
    assert_eq!(device.wraps.load(Ordering::Relaxed), 0);
    // Anything inside the four mappings is now a slice of what was learnt.
    let s = sl(base + 4096 * 2 - 8, 4096 + 16).expect("inside");
    assert_eq!((s.ptr().0, s.len()), (base + 8184, 4112));
    assert_eq!(device.ranges.load(Ordering::Relaxed), 4);
    assert_eq!(cache.allocations(), 1);
    drop(mem);
}

/// Two host ranks each hand the caller ranges of a several-mapping range, starting inside one
/// mapping and ending inside another, for all-reduce (in and out of place) and all-gather:
/// correct against a CPU reference, outputs poisoned first.
#[test]
fn collectives_run_on_ranges_across_several_mappings() {
    let n = 2;
    let count = 3000; // 12000 bytes of f32: over three 4 KiB mappings
    let results = with_ranks(n, |r, c| {
        let dev = c.communicator().device();
        let s = c.stream(None).expect("stream");
        let mem = dev.alloc_pieces(4096, 8).expect("pieces");
        let base = mem.ptr().0;
        let input = |p: usize| -> Vec<f32> {
            (0..count)
                .map(|i| ((i * 5 + p * 11) % 29) as f32 - 14.0)
                .collect()
        };
        let want: Vec<f32> = (0..count)
            .map(|i| (0..n).map(|p| input(p)[i]).sum())
            .collect();
        let write = |at: u64, v: &[f32]| {
            // SAFETY: `at` lies in `mem` (host memory) with room for `v`; no call runs now.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), at as *mut f32, v.len()) }
        };
        // SAFETY: as above; the calls have finished (`finish`).
        let read = |at: u64, len: usize| unsafe {
            std::slice::from_raw_parts(at as *const f32, len).to_vec()
        };
        let mut wrong = Vec::new();
        let (src, dst) = (base + 100, base + 4 * 4096 + 52);
        for in_place in [false, true] {
            let out = if in_place { src } else { dst };
            write(src, &input(r));
            if !in_place {
                write(dst, &vec![f32::NAN; count]);
            }
            let bytes = count * 4;
            // SAFETY: both ranges lie in `mem`, which outlives the call.
            let (i, o) = unsafe { c.wrap_pair((src, bytes), (out, bytes)) }.expect("wrap");
            let call = CollectiveCall::new(CollectiveKind::AllReduce, &i, &o, count, DataType::F32)
                .op(ReduceOp::Sum);
            c.collective(&call, &*s).expect("all-reduce");
            c.finish(&*s).expect("finish");
            if read(out, count) != want {
                wrong.push(format!("all-reduce, in place {in_place}"));
            }
        }
        let per = 1000;
        write(src, &input(r)[..per]);
        write(dst, &vec![f32::NAN; per * n]);
        // SAFETY: as above.
        let (i, o) = unsafe { c.wrap_pair((src, per * 4), (dst, per * n * 4)) }.expect("wrap");
        let call = CollectiveCall::new(CollectiveKind::AllGather, &i, &o, per, DataType::F32);
        c.collective(&call, &*s).expect("all-gather");
        c.finish(&*s).expect("finish");
        let got = read(dst, per * n);
        for p in 0..n {
            if got[p * per..(p + 1) * per] != input(p)[..per] {
                wrong.push(format!("all-gather block {p}"));
            }
        }
        drop(mem);
        wrong
    });
    for (r, w) in results.iter().enumerate() {
        assert!(w.is_empty(), "rank {r}: {w:?}");
    }
}

/// Random-looking f32 data for `rank` (exact sums: small integers).
fn ints(rank: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 31 + rank * 17) % 97) as f32 - 48.0)
        .collect()
}

/// A reduce over more than one chunk ([`crate::REDUCE_CHUNK_BYTES`]) lands in the root's output
/// only (the other ranks' outputs keep their poison), for each root; a root that is not a rank
/// is refused naming it.
#[test]
fn reduce_lands_in_the_roots_output_across_chunks() {
    let n = crate::REDUCE_CHUNK_BYTES / 4 + 37;
    with_ranks(2, |r, c| {
        let dev = c.communicator().device();
        let s = c.stream(None).expect("own stream");
        let (a, b) = (
            dev.alloc(n * 4, MemoryKind::Device).unwrap(),
            dev.alloc(n * 4, MemoryKind::Device).unwrap(),
        );
        write_f32(&a, &ints(r, n));
        for root in [1, 0] {
            write_f32(&b, &vec![f32::NAN; n]);
            let call = crate::ReduceCall {
                send: a.ptr().0,
                recv: b.ptr().0,
                count: n,
                dtype: DataType::F32,
                op: ReduceOp::Sum,
                root,
            };
            // SAFETY: both buffers hold `n` floats and outlive the call (it has run on return).
            unsafe { c.reduce(&call, crate::Tuning::default(), &*s) }.expect("reduce");
            let got = read_f32(&b, n);
            if r == root {
                let (x, y) = (ints(0, n), ints(1, n));
                let bad = (0..n).filter(|&i| got[i] != x[i] + y[i]).count();
                assert_eq!(bad, 0, "rank {r}: {bad} wrong of {n} (root {root})");
            } else {
                assert!(
                    got.iter().all(|v| v.is_nan()),
                    "a non-root output was written"
                );
            }
        }
        let call = crate::ReduceCall {
            send: a.ptr().0,
            recv: b.ptr().0,
            count: 4,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            root: 2,
        };
        // SAFETY: as above (refused before anything is enqueued).
        let e = unsafe { c.reduce(&call, crate::Tuning::default(), &*s) }.unwrap_err();
        assert!(e.to_string().contains("root 2 is not a rank of 2"), "{e}");
    });
}

/// An algorithm asked for that cannot serve the call fails, unless the tuning allows the
/// policy's choice; then the result is right.
#[test]
fn a_tuned_call_falls_back_to_the_policy_only_when_allowed() {
    with_ranks(2, |r, c| {
        let dev = c.communicator().device();
        let s = c.stream(None).expect("own stream");
        let (a, b) = (
            dev.alloc(256, MemoryKind::Device).unwrap(),
            dev.alloc(512, MemoryKind::Device).unwrap(),
        );
        write_f32(&a, &ints(r, 64));
        write_f32(&b, &[f32::NAN; 128]);
        let (ia, ob) = (a.full(), b.full());
        let call = CollectiveCall::new(CollectiveKind::AllGather, &ia, &ob, 64, DataType::F32);
        let read = crate::Tuning {
            algorithm: Some(crate::AlgorithmId::Read),
            fallback: false,
            launch_event: None,
        };
        let e = c.collective_tuned(&call, read, &*s).unwrap_err();
        assert!(e.to_string().contains("read"), "{e}");
        assert!(read_f32(&b, 128).iter().all(|v| v.is_nan()));
        let tuning = crate::Tuning {
            fallback: true,
            ..read
        };
        c.collective_tuned(&call, tuning, &*s)
            .expect("the policy's choice");
        let want: Vec<f32> = ints(0, 64).into_iter().chain(ints(1, 64)).collect();
        assert_eq!(read_f32(&b, 128), want);
    });
}

/// Registration is collective and agreed: every rank's buffer is mapped when every rank passes
/// one; when one rank passes none, every rank records it (`None`) and nobody waits; with one
/// rank there is nothing to map. Windows deregister in order.
#[test]
fn registration_is_agreed_by_every_rank() {
    with_ranks(2, |r, c| {
        let dev = c.communicator().device();
        let a = dev.alloc(1 << 16, MemoryKind::Device).unwrap();
        let w = c.register(Some(&a.full())).expect("register");
        let w = w.expect("every rank passed memory the peers can map");
        let mine = (r == 0).then(|| a.full());
        let none = c
            .register(mine.as_ref())
            .expect("register with one rank out");
        assert!(
            none.is_none(),
            "rank {r}: mapped although rank 1 passed nothing"
        );
        c.deregister(w).expect("deregister");
    });
    with_ranks(1, |_, c| {
        let a = c
            .communicator()
            .device()
            .alloc(4096, MemoryKind::Device)
            .unwrap();
        assert!(c.register(Some(&a.full())).expect("register").is_none());
    });
}

/// The completion record and the watchdog's counting: a call is outstanding from its issue
/// until its stream's store lands; a withdrawn call is not; a call after idle streams starts
/// the stall clock afresh; the survey runs once per stall.
#[test]
fn the_watchdog_counts_outstanding_calls_from_their_issue() {
    with_ranks(1, |_, caller| {
        let c = super::completion::Completion::attach(&caller.comm).expect("attach");
        let stream = caller.comm.device().create_stream().expect("stream");
        let stream: &mscclpp_hal::DynStream = &*stream;
        let zero = std::time::Duration::ZERO;
        let surveys = AtomicUsize::new(0);
        let survey = || {
            surveys.fetch_add(1, Ordering::Relaxed);
            Some("behind".to_string())
        };
        assert_eq!(c.completed(), 0);
        assert!(c.stalled(zero, survey).is_none(), "nothing issued");
        assert!(c.issue(stream, 1).expect("issue"));
        let (done, _, why) = c.stalled(zero, survey).expect("call 1 outstanding");
        assert_eq!((done, why.as_deref()), (0, Some("behind")));
        assert!(c.stalled(zero, survey).is_some());
        assert_eq!(surveys.load(Ordering::Relaxed), 1, "one survey per stall");
        c.mark(stream, 1).expect("mark");
        stream.synchronize().expect("sync");
        assert_eq!(c.completed(), 1);
        assert!(c.stalled(zero, survey).is_none(), "call 1 finished");
        // Idle streams: the next call's clock starts at its issue, not at the last poll.
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert!(c.issue(stream, 2).expect("issue"));
        assert!(
            c.stalled(std::time::Duration::from_millis(50), survey)
                .is_none(),
            "an idle communicator is not stalled"
        );
        // A call whose enqueue failed is not outstanding.
        c.withdraw(2);
        assert!(c.stalled(zero, survey).is_none());
        assert_eq!(surveys.load(Ordering::Relaxed), 1);
    });
}
