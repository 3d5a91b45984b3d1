//! The steady state of the C library's hot path allocates nothing: once a communicator has seen a
//! call's buffers and stream, calling again on them costs one handle lookup and no heap
//! allocation in the library — the host cost PyTorch's eager users pay on every call.
//!
//! A counting global allocator (per thread: each rank is a thread of this process, calling the
//! exports of the library's rlib directly, as nccl-tests `-t` does) counts what one call
//! allocates on the calling thread. The host backend's stream is itself a queue of boxed jobs (a
//! GPU stream takes a launch without allocating), so the library's own share is what a call
//! allocates beyond what the same work costs enqueued on a host stream directly, and that is
//! measured in the same run: one rank's copy (out of place), nothing (in place). With 2 ranks the
//! collectives' launches are the host jobs; the bound there is that the count per call does not
//! grow with the number of calls and that wrapping the buffers adds nothing (the same calls with
//! `MSCCLPP_WRAP_CACHE=0` allocate more, checked in a child process).
//!
//! Runs with `cargo test -p mscclpp-nccl --test steady_state`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::process::Command;

use libtest_mimic::{Failed, Trial};
use mscclpp_nccl::abi::NcclUniqueId;
use mscclpp_nccl::{
    ncclAllGather, ncclAllReduce, ncclBroadcast, ncclCommDestroy, ncclCommInitRank,
    ncclGetUniqueId, ncclMemAlloc, ncclMemFree, ncclReduceScatter,
};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a const-initialised thread-local
// `Cell` with no destructor, so touching it never allocates or re-enters.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

const F32: c_int = 7;
const SUM: c_int = 0;
const COUNT: usize = 1024;
const CALLS: u64 = 200;
const CHILD: &str = "MSCCLPP_STEADY_STATE_CHILD";

type Comm = *mut c_void;

fn check(what: &str, rc: c_int) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{what} returned {rc}"))
    }
}

/// Memory of the communicator's device (host memory on the host backend), filled with `v`.
fn alloc_f32(v: f32) -> Result<*mut f32, String> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check("ncclMemAlloc", unsafe {
        ncclMemAlloc(&mut p, COUNT * 4 * 2)
    })?;
    let p = p.cast::<f32>();
    // SAFETY: host-backend memory of COUNT * 2 floats, no call uses it yet.
    unsafe { std::slice::from_raw_parts_mut(p, COUNT * 2) }.fill(v);
    Ok(p)
}

/// One rank's communicator of `n` on this thread.
fn init(id: NcclUniqueId, n: usize, r: usize) -> Result<Comm, String> {
    let mut c: Comm = std::ptr::null_mut();
    // SAFETY: valid out-pointer; `id` from ncclGetUniqueId.
    check("ncclCommInitRank", unsafe {
        ncclCommInitRank(&mut c, n as c_int, id, r as c_int)
    })?;
    Ok(c)
}

/// The calls a steady state repeats, on buffers `a` (input) and `b` (output).
fn calls(c: Comm, n: usize, a: *mut f32, b: *mut f32, in_place: bool) -> Result<(), String> {
    let (send, recv) = if in_place {
        (a as *const c_void, a.cast::<c_void>())
    } else {
        (a as *const c_void, b.cast::<c_void>())
    };
    let null = std::ptr::null_mut();
    // SAFETY: COUNT * 2 floats at both pointers (enough for every call's output over <= 2
    // ranks); the host backend's calls have run when they return.
    unsafe {
        check(
            "ncclAllReduce",
            ncclAllReduce(send, recv, COUNT, F32, SUM, c, null),
        )?;
        check(
            "ncclBroadcast",
            ncclBroadcast(send, recv, COUNT, F32, 0, c, null),
        )?;
        if !in_place {
            check(
                "ncclAllGather",
                ncclAllGather(send, recv, COUNT / n, F32, c, null),
            )?;
            check(
                "ncclReduceScatter",
                ncclReduceScatter(send, recv, COUNT / n, F32, SUM, c, null),
            )?;
        }
    }
    Ok(())
}

/// Allocations per round of [`calls`] on this thread, after a warm-up round.
fn per_round(c: Comm, n: usize, a: *mut f32, b: *mut f32, in_place: bool) -> Result<f64, String> {
    for _ in 0..3 {
        calls(c, n, a, b, in_place)?;
    }
    let before = allocs();
    for _ in 0..CALLS {
        calls(c, n, a, b, in_place)?;
    }
    Ok((allocs() - before) as f64 / CALLS as f64)
}

/// Allocations per in-place all-reduce when every call names another range of one allocation,
/// as nccl-tests' loop does (it moves its buffers by the message size on each iteration) and as
/// tensors carved from a caching allocator's segment do: more ranges than the wrappers kept.
fn moving_in_place(c: Comm, a: *mut f32) -> Result<f64, String> {
    const RANGES: usize = 4 * 32;
    const STEP: usize = 8;
    let call = |i: usize| {
        // SAFETY: COUNT * 2 floats at `a`; an offset of at most (RANGES - 1) * STEP < COUNT
        // stays inside them.
        let p = unsafe { a.add((i % RANGES) * STEP) };
        // SAFETY: [p, p + COUNT / 2) lies inside the COUNT * 2 floats at `a`; the host
        // backend's calls have run when they return.
        let rc = unsafe {
            ncclAllReduce(
                p as *const c_void,
                p.cast(),
                COUNT / 2,
                F32,
                SUM,
                c,
                std::ptr::null_mut(),
            )
        };
        check("ncclAllReduce (moving)", rc)
    };
    call(0)?;
    let before = allocs();
    for i in 0..CALLS as usize * 4 {
        call(i + 1)?;
    }
    Ok((allocs() - before) as f64 / (CALLS * 4) as f64)
}

/// What one host-stream copy of the same size costs (the backend's share of an out-of-place
/// call on one rank: each of its operations is one copy).
fn host_copy_cost() -> Result<f64, String> {
    use mscclpp::hal::{Backend, MemoryKind};
    let d = mscclpp::host::HostBackend::new()
        .open_device(0)
        .map_err(|e| e.to_string())?;
    let s = d.create_stream().map_err(|e| e.to_string())?;
    let (x, y) = (
        d.alloc(COUNT * 4, MemoryKind::Device)
            .map_err(|e| e.to_string())?,
        d.alloc(COUNT * 4, MemoryKind::Device)
            .map_err(|e| e.to_string())?,
    );
    let (x, y) = (x.full(), y.full());
    s.copy(&y, &x).map_err(|e| e.to_string())?;
    s.synchronize().map_err(|e| e.to_string())?;
    let before = allocs();
    for _ in 0..CALLS {
        s.copy(&y, &x).map_err(|e| e.to_string())?;
        s.synchronize().map_err(|e| e.to_string())?;
    }
    Ok((allocs() - before) as f64 / CALLS as f64)
}

fn one_rank() -> Result<(), Failed> {
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    check("ncclGetUniqueId", unsafe { ncclGetUniqueId(&mut id) })?;
    let c = init(id, 1, 0)?;
    let (a, b) = (alloc_f32(1.0)?, alloc_f32(-1.0)?);
    let in_place = per_round(c, 1, a, b, true)?;
    let out_of_place = per_round(c, 1, a, b, false)?;
    let moving = moving_in_place(c, a)?;
    let copy = host_copy_cost()?;
    // SAFETY: the calls have run (host backend); nothing uses the memory any more.
    unsafe {
        check("ncclCommDestroy", ncclCommDestroy(c))?;
        check("ncclMemFree", ncclMemFree(a.cast()))?;
        check("ncclMemFree", ncclMemFree(b.cast()))?;
    }
    println!(
        "1 rank: allocations per round: in place {in_place}, out of place {out_of_place} (4 calls; a host-stream copy costs {copy})"
    );
    println!("1 rank: allocations per in-place call on a new range of one allocation: {moving}");
    if moving != 0.0 {
        return Err(format!(
            "1 rank, in place, a new range of one allocation each call: {moving} allocations per call, expected 0"
        )
        .into());
    }
    if in_place != 0.0 {
        return Err(format!(
            "1 rank, in place (2 calls that move no data): {in_place} allocations per round, expected 0"
        )
        .into());
    }
    if out_of_place > 4.0 * copy {
        return Err(format!(
            "1 rank, out of place: {out_of_place} allocations per round of 4 calls, more than their 4 host-stream copies ({copy} each): the library allocates per call"
        )
        .into());
    }
    Ok(())
}

/// Allocations per round on each of 2 ranks (threads), in the child process this test starts.
fn two_ranks() -> Result<Vec<(f64, f64)>, String> {
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    check("ncclGetUniqueId", unsafe { ncclGetUniqueId(&mut id) })?;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || -> Result<(f64, f64), String> {
                    let c = init(id, 2, r)?;
                    let (a, b) = (alloc_f32(r as f32 + 1.0)?, alloc_f32(-1.0)?);
                    let short = per_round(c, 2, a, b, false)?;
                    // Ten times as many calls: the same count per call, or something grows.
                    let before = allocs();
                    for _ in 0..10 * CALLS {
                        calls(c, 2, a, b, false)?;
                    }
                    let long = (allocs() - before) as f64 / (10 * CALLS) as f64;
                    // SAFETY: every call has run (host backend).
                    unsafe {
                        check("ncclCommDestroy", ncclCommDestroy(c))?;
                        check("ncclMemFree", ncclMemFree(a.cast()))?;
                        check("ncclMemFree", ncclMemFree(b.cast()))?;
                    }
                    Ok((short, long))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| "rank thread panicked".to_string())?)
            .collect()
    })
}

fn child_counts(cache: &str) -> Result<Vec<(f64, f64)>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .env(CHILD, "1")
        .env("MSCCLPP_WRAP_CACHE", cache)
        .env_remove("MSCCLPP_NCCL_LIB_PATH")
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "child (MSCCLPP_WRAP_CACHE={cache}) failed: {}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("COUNTS "))
        .map(|l| {
            let v: Vec<f64> = l.split(' ').filter_map(|x| x.parse().ok()).collect();
            match v[..] {
                [a, b] => Ok((a, b)),
                _ => Err(format!("bad child line {l:?}")),
            }
        })
        .collect()
}

fn two_ranks_steady() -> Result<(), Failed> {
    let cached = child_counts("1")?;
    let uncached = child_counts("0")?;
    println!(
        "2 ranks: allocations per round of 4 calls (steady, 10x longer): kept wrappers {cached:?}, wrapped every call {uncached:?}"
    );
    if cached.len() != 2 || uncached.len() != 2 {
        return Err(format!("expected 2 ranks' counts, got {cached:?} and {uncached:?}").into());
    }
    for (r, (&(short, long), &(unc, _))) in cached.iter().zip(&uncached).enumerate() {
        // Allow for rounding of the averages; growth of one allocation per 4 calls is a leak.
        if long > short + 0.25 {
            return Err(format!(
                "rank {r}: {short} allocations per round at first, {long} later: the steady state grows"
            )
            .into());
        }
        // 4 calls wrap 8 buffers, each at least one allocation when not kept; but a broadcast
        // off the root reads nothing of its own, so its input is its output's range, wrapped once.
        let wraps = if r == 0 { 8.0 } else { 7.0 };
        if unc < short + wraps - 0.25 {
            return Err(format!(
                "rank {r}: {short} allocations per round with kept wrappers, {unc} without: wrapping should account for {wraps}"
            )
            .into());
        }
    }
    Ok(())
}

fn main() {
    if std::env::var_os(CHILD).is_some() {
        match two_ranks() {
            Ok(v) => {
                for (a, b) in v {
                    println!("COUNTS {a} {b}");
                }
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let args = libtest_mimic::Arguments::from_args();
    let tests = vec![
        Trial::test(
            "one_rank_steady_state_allocates_nothing_in_the_library",
            one_rank,
        ),
        Trial::test(
            "two_ranks_steady_state_is_flat_and_wraps_nothing",
            two_ranks_steady,
        ),
    ];
    libtest_mimic::run(&args, tests).exit();
}
