//! Memory of several mappings through the C ABI (`dlopen`, as a C program): what PyTorch's
//! expandable segments hand NCCL — one virtual range made of many mappings — made here with
//! the host backend's `Device::alloc_pieces`. Two ranks as child processes: `ncclCommRegister`
//! and `ncclCommWindowRegister` of a range spanning every mapping, all-reduce in place on a range
//! that starts inside the first mapping and ends inside the fourth, all-gather and
//! reduce-scatter out of place between two such ranges, each against a CPU reference with the
//! outputs poisoned first; then the deregistrations. Runs with
//! `cargo test -p mscclpp-nccl --test segments`.

#[macro_use]
mod support;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::time::Duration;

use mscclpp::hal::Backend;
use mscclpp_nccl::abi::NcclUniqueId;
use support::{
    CollFn, Comm, MoveFn, fresh_dir, lib_path, open_lib, publish, read_id, run_if_rank, run_ranks,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_SEGMENTS_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_SEGMENTS_TEST_DIR";
const NRANKS: usize = 2;
const PIECE: usize = 4096;
const PIECES: usize = 8;
const NCCL_FLOAT32: c_int = 7;
const NCCL_SUM: c_int = 0;

fn values(rank: usize, salt: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + rank * 5 + salt) % 23) as f32 - 11.0)
        .collect()
}

fn write(at: *mut c_void, v: &[f32]) {
    // SAFETY: `at` lies in a pieces range of this process with room for `v` (the callers'
    // offsets and lengths stay inside it); no call runs on it now.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), at.cast::<f32>(), v.len()) }
}

fn read(at: *const c_void, n: usize) -> Vec<f32> {
    // SAFETY: as for `write`; the host backend's calls have run when they return.
    unsafe { std::slice::from_raw_parts(at.cast::<f32>(), n) }.to_vec()
}

fn rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    let lib = open_lib()?;
    let get_id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
    let init = sym!(
        lib,
        "ncclCommInitRank",
        fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
    );
    let destroy = sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int);
    let last_err = sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char);
    let all_reduce: CollFn = sym!(lib, "ncclAllReduce" as CollFn);
    let reduce_scatter: CollFn = sym!(lib, "ncclReduceScatter" as CollFn);
    let all_gather: MoveFn = sym!(lib, "ncclAllGather" as MoveFn);
    let reg = sym!(
        lib,
        "ncclCommRegister",
        fn(Comm, *mut c_void, usize, *mut *mut c_void) -> c_int
    );
    let dereg = sym!(lib, "ncclCommDeregister", fn(Comm, *mut c_void) -> c_int);
    let win_reg = sym!(
        lib,
        "ncclCommWindowRegister",
        fn(Comm, *mut c_void, usize, *mut *mut c_void, c_int) -> c_int
    );
    let win_dereg = sym!(
        lib,
        "ncclCommWindowDeregister",
        fn(Comm, *mut c_void) -> c_int
    );
    let check = |what: &str, got: c_int| -> Result<(), String> {
        if got == 0 {
            return Ok(());
        }
        // SAFETY: the library's thread-local NUL-terminated message.
        let msg = unsafe { CStr::from_ptr(last_err(std::ptr::null_mut())) };
        Err(format!("{what}: code {got}: {}", msg.to_string_lossy()))
    };

    // Two ranges of several mappings each, made by the host backend of this process.
    let device = mscclpp::host::HostBackend::new()
        .open_device(0)
        .map_err(|e| e.to_string())?;
    let a = device
        .alloc_pieces(PIECE, PIECES)
        .map_err(|e| e.to_string())?;
    let b = device
        .alloc_pieces(PIECE, PIECES)
        .map_err(|e| e.to_string())?;
    let (a0, b0) = (a.ptr().0 as usize, b.ptr().0 as usize);
    let at = |base: usize, off: usize| (base + off) as *mut c_void;

    let id = if rank == 0 {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer.
        check("ncclGetUniqueId", unsafe { get_id(&mut id) })?;
        publish(dir, &id.internal)?;
        id
    } else {
        read_id(dir)?
    };
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check("ncclCommInitRank", unsafe {
        init(&mut comm, NRANKS as c_int, id, rank as c_int)
    })?;
    let stream = std::ptr::null_mut();

    // Registration of the whole range (every mapping), local and collective.
    let (mut h, mut w): (*mut c_void, *mut c_void) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid out-pointers; `a` holds PIECE * PIECES bytes.
    unsafe {
        check(
            "ncclCommRegister of a range of 8 mappings",
            reg(comm, at(a0, 0), PIECE * PIECES, &mut h),
        )?;
        check(
            "ncclCommWindowRegister of a range of 8 mappings",
            win_reg(comm, at(b0, 0), PIECE * PIECES, &mut w, 0),
        )?;
    }

    // All-reduce in place: from 100 bytes into the first mapping to inside the fourth.
    let n = 3 * PIECE / 4;
    let want: Vec<f32> = (0..n)
        .map(|i| (0..NRANKS).map(|r| values(r, 1, n)[i]).sum())
        .collect();
    write(at(a0, 100), &values(rank, 1, n));
    // SAFETY: the range lies in `a`; the stream is the communicator's own (NULL).
    check("ncclAllReduce in place across mappings", unsafe {
        all_reduce(
            at(a0, 100),
            at(a0, 100),
            n,
            NCCL_FLOAT32,
            NCCL_SUM,
            comm,
            stream,
        )
    })?;
    if read(at(a0, 100), n) != want {
        return Err("all-reduce in place across mappings: wrong values".into());
    }

    // All-gather from `a` (inside mappings 1-3) into `b` (starting inside its window).
    let per = PIECE / 2;
    write(at(a0, PIECE + 12), &values(rank, 2, per));
    write(at(b0, 36), &vec![f32::NAN; per * NRANKS]);
    // SAFETY: both ranges lie in their allocations.
    check("ncclAllGather across mappings", unsafe {
        all_gather(
            at(a0, PIECE + 12),
            at(b0, 36),
            per,
            NCCL_FLOAT32,
            comm,
            stream,
        )
    })?;
    let got = read(at(b0, 36), per * NRANKS);
    for r in 0..NRANKS {
        if got[r * per..(r + 1) * per] != values(r, 2, per)[..] {
            return Err(format!("all-gather across mappings: block {r} wrong"));
        }
    }

    // Reduce-scatter from `b` into `a`.
    let total = per * NRANKS;
    write(at(b0, 4 * PIECE - 20), &values(rank, 3, total));
    write(at(a0, 2 * PIECE - 8), &vec![f32::NAN; per]);
    // SAFETY: both ranges lie in their allocations.
    check("ncclReduceScatter across mappings", unsafe {
        reduce_scatter(
            at(b0, 4 * PIECE - 20),
            at(a0, 2 * PIECE - 8),
            per,
            NCCL_FLOAT32,
            NCCL_SUM,
            comm,
            stream,
        )
    })?;
    let want: Vec<f32> = (rank * per..(rank + 1) * per)
        .map(|i| (0..NRANKS).map(|r| values(r, 3, total)[i]).sum())
        .collect();
    if read(at(a0, 2 * PIECE - 8), per) != want {
        return Err("reduce-scatter across mappings: wrong values".into());
    }

    // SAFETY: handles of this library; the window deregistration is collective.
    unsafe {
        check("ncclCommDeregister", dereg(comm, h))?;
        check("ncclCommWindowDeregister", win_dereg(comm, w))?;
        check("ncclCommDestroy", destroy(comm))?;
    }
    drop((a, b));
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

/// The test's failure outside a rank: this runner has no harness to report it.
fn fail(e: &str) -> ! {
    eprintln!("segments: {e}");
    std::process::exit(1);
}

fn main() {
    run_if_rank(ROLE_VAR, DIR_VAR, rank_main);
    if let Err(e) = lib_path() {
        fail(&e);
    }
    let dir = fresh_dir("segments").unwrap_or_else(|e| fail(&e));
    let ran = run_ranks(
        (ROLE_VAR, DIR_VAR),
        &dir,
        NRANKS,
        Duration::from_secs(120),
        |_| {},
    );
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = ran {
        fail(&e);
    }
    println!("segments: 2 ranks on the host backend, ranges of 8 mappings: every check passed");
}
