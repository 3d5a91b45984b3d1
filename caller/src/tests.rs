//! The caller side on the host backend: its rules (streams, sizes, one rank) and plan staging
//! with 2 ranks in threads, every result checked against a CPU reference.

use std::sync::Arc;

use mscclpp_collectives::{CollectiveCall, CollectiveKind, P2pKind, P2pOp};
use mscclpp_comm::Communicator;
use mscclpp_comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot};
use mscclpp_hal::{Backend, DataType, DeviceBuffer, MemoryKind, ReduceOp};

use super::{Caller, buffer_bytes};

/// `n` callers of one communicator, one per thread, each running `f(rank, caller)`.
fn with_ranks<T: Send>(n: usize, f: impl Fn(usize, &Caller) -> T + Sync) -> Vec<T> {
    let cfg = BootstrapConfig::default();
    let (_root, uid) =
        BootstrapRoot::start("127.0.0.1:0".parse().expect("addr"), n, &cfg).expect("root");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (uid, cfg, f) = (uid, cfg.clone(), &f);
                s.spawn(move || {
                    let boot = Arc::new(Bootstrap::new(&uid, r, n, cfg).expect("bootstrap"));
                    let device = mscclpp_host::HostBackend::new()
                        .open_device(0)
                        .expect("host device");
                    let caller =
                        Caller::new(Arc::new(Communicator::new(boot, device))).expect("caller");
                    f(r, &caller)
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
        assert!(c.serves() && c.collectives().is_none() && c.is_host());
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

#[test]
fn caller_memory_is_wrapped_once_per_range_and_forgotten_after_a_free() {
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

/// An in-place call's input and output are one wrapper; other pairs are two (wrapped as
/// [`Caller::wrap`] does each, with the cache off too).
#[test]
fn a_call_in_place_wraps_one_range() {
    with_ranks(1, |_, caller| {
        let device = caller.communicator().device().clone();
        let mem = device.alloc(8192, MemoryKind::Device).expect("memory");
        let base = mem.ptr().0;
        let same = |a: &DeviceBuffer, b: &DeviceBuffer| Arc::ptr_eq(a.allocation(), b.allocation());
        // SAFETY: `mem` outlives every wrapper made here; nothing runs on them.
        let pair = |i: (u64, usize), o: (u64, usize)| unsafe { caller.wrap_pair(i, o) }.unwrap();
        let (i, o) = pair((base, 4096), (base, 4096));
        assert!(same(&i, &o), "in place: one wrapper");
        let (i, o) = pair((base, 4096), (base + 4096, 4096));
        assert!(!same(&i, &o) && o.ptr().0 == base + 4096);
        let (i, o) = pair((base, 4096), (base, 8192));
        assert!(
            !same(&i, &o) && (i.len(), o.len()) == (4096, 8192),
            "same start, other length"
        );
        // SAFETY: refused before any use.
        assert!(unsafe { caller.wrap_pair((base, 16), (0, 16)) }.is_err());
    });
}
