//! Communicator lifecycle through the C ABI on the host backend, in the call sequences of real
//! clients, with every collective's data checked against a CPU reference:
//!
//! - **nccl-tests** (`-g N`, one thread driving every device): `ncclGetUniqueId`, a group of
//!   `ncclCommInitRankConfig` from one thread, `ncclCommInitAll` (NULL devlist, a device listed
//!   twice, more devices than the host backend has), all-reduces, `ncclCommGetAsyncError`
//!   polling, destroy;
//! - **PyTorch's ProcessGroupNCCL** (4 processes): `ncclCommInitRankConfig` with `blocking = 0`
//!   (`ncclInProgress`, the handle refused until `ncclCommGetAsyncError` turns `ncclSuccess`),
//!   a non-blocking `ncclCommSplit` (reversed keys, both halves) polled on parent and child, a
//!   `NCCL_SPLIT_NOCOLOR` split, `ncclCommShrink` of a live rank, collectives on every
//!   communicator, a non-blocking `ncclCommFinalize`, abort and destroy; then a rank dies and the
//!   survivors shrink it away with `NCCL_SHRINK_ABORT` and go on.
//!
//! Runs with `cargo test -p mscclpp-nccl --test lifecycle`.

#[macro_use]
mod support;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};
use mscclpp_nccl::abi::{NcclConfig, NcclUniqueId};
use support::{
    CollFn, Comm, fresh_dir, lib_path, mark, open_lib, rank_command, rank_failure, run_if_rank,
    self_command, wait_file, wait_or_kill,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_LIFECYCLE_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_LIFECYCLE_TEST_DIR";
const INPROC_VAR: &str = "MSCCLPP_NCCL_LIFECYCLE_TEST_INPROC";
const NRANKS: usize = 4;
const COUNT: usize = 777;

const SUCCESS: c_int = 0;
const INVALID_ARGUMENT: c_int = 4;
const INVALID_USAGE: c_int = 5;
const REMOTE_ERROR: c_int = 6;
const IN_PROGRESS: c_int = 7;
const NOCOLOR: c_int = -1;
const SHRINK_ABORT: c_int = 1;
const F32: c_int = 7;
const SUM: c_int = 0;

/// The exports these sequences use.
struct Api {
    _lib: libloading::Library,
    get_id: unsafe extern "C" fn(*mut NcclUniqueId) -> c_int,
    init: unsafe extern "C" fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int,
    init_config: unsafe extern "C" fn(*mut Comm, c_int, NcclUniqueId, c_int, *mut c_void) -> c_int,
    init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> c_int,
    init_scalable: unsafe extern "C" fn(
        *mut Comm,
        c_int,
        c_int,
        c_int,
        *mut NcclUniqueId,
        *mut c_void,
    ) -> c_int,
    split: unsafe extern "C" fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> c_int,
    shrink: unsafe extern "C" fn(Comm, *mut c_int, c_int, *mut Comm, *mut c_void, c_int) -> c_int,
    count: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    user_rank: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    async_err: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    finalize: unsafe extern "C" fn(Comm) -> c_int,
    destroy: unsafe extern "C" fn(Comm) -> c_int,
    abort: unsafe extern "C" fn(Comm) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    mem_alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int,
    all_reduce: CollFn,
    last_err: unsafe extern "C" fn(Comm) -> *const c_char,
}

impl Api {
    fn open() -> Result<Self, String> {
        let lib = open_lib()?;
        Ok(Api {
            get_id: sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int),
            init: sym!(
                lib,
                "ncclCommInitRank",
                fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
            ),
            init_config: sym!(
                lib,
                "ncclCommInitRankConfig",
                fn(*mut Comm, c_int, NcclUniqueId, c_int, *mut c_void) -> c_int
            ),
            init_all: sym!(
                lib,
                "ncclCommInitAll",
                fn(*mut Comm, c_int, *const c_int) -> c_int
            ),
            init_scalable: sym!(
                lib,
                "ncclCommInitRankScalable",
                fn(*mut Comm, c_int, c_int, c_int, *mut NcclUniqueId, *mut c_void) -> c_int
            ),
            split: sym!(
                lib,
                "ncclCommSplit",
                fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> c_int
            ),
            shrink: sym!(
                lib,
                "ncclCommShrink",
                fn(Comm, *mut c_int, c_int, *mut Comm, *mut c_void, c_int) -> c_int
            ),
            count: sym!(lib, "ncclCommCount", fn(Comm, *mut c_int) -> c_int),
            user_rank: sym!(lib, "ncclCommUserRank", fn(Comm, *mut c_int) -> c_int),
            async_err: sym!(lib, "ncclCommGetAsyncError", fn(Comm, *mut c_int) -> c_int),
            finalize: sym!(lib, "ncclCommFinalize", fn(Comm) -> c_int),
            destroy: sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int),
            abort: sym!(lib, "ncclCommAbort", fn(Comm) -> c_int),
            group_start: sym!(lib, "ncclGroupStart", fn() -> c_int),
            group_end: sym!(lib, "ncclGroupEnd", fn() -> c_int),
            mem_alloc: sym!(lib, "ncclMemAlloc", fn(*mut *mut c_void, usize) -> c_int),
            all_reduce: sym!(lib, "ncclAllReduce" as CollFn),
            last_err: sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char),
            _lib: lib,
        })
    }

    fn last(&self) -> String {
        // SAFETY: the library's thread-local NUL-terminated message.
        unsafe { CStr::from_ptr((self.last_err)(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned()
    }

    fn expect(&self, what: &str, got: c_int, want: c_int) -> Result<(), String> {
        if got != want {
            return Err(format!(
                "{what}: returned {got}, expected {want} (last error: {})",
                self.last()
            ));
        }
        Ok(())
    }

    fn count_of(&self, c: Comm) -> Result<(usize, usize), String> {
        let (mut n, mut r) = (-1, -1);
        // SAFETY: valid out-pointers; the handle is checked by the library.
        unsafe {
            self.expect("ncclCommCount", (self.count)(c, &mut n), SUCCESS)?;
            self.expect("ncclCommUserRank", (self.user_rank)(c, &mut r), SUCCESS)?;
        }
        Ok((n as usize, r as usize))
    }

    /// Polls `ncclCommGetAsyncError` as PyTorch's `waitReady` does: until it is not
    /// `ncclInProgress` (the answer), within 60 s.
    fn wait_ready(&self, c: Comm) -> Result<c_int, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut e = -1;
            // SAFETY: valid out-pointer.
            let rc = unsafe { (self.async_err)(c, &mut e) };
            self.expect("ncclCommGetAsyncError", rc, SUCCESS)?;
            if e != IN_PROGRESS {
                return Ok(e);
            }
            if Instant::now() > deadline {
                return Err("ncclCommGetAsyncError stayed ncclInProgress for 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A device buffer (host memory on the host backend) of `n` floats.
    fn alloc(&self, n: usize) -> Result<*mut f32, String> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.expect(
            "ncclMemAlloc",
            // SAFETY: valid out-pointers and live or checked handles (the library checks them).
            unsafe { (self.mem_alloc)(&mut p, n * 4) },
            SUCCESS,
        )?;
        Ok(p.cast())
    }
}

fn config(blocking: c_int) -> NcclConfig {
    let mut c = NcclConfig::INITIALIZER;
    c.blocking = blocking;
    c
}

/// Rank `r`'s input among members identified by `id` (its rank in the world): small integers,
/// exact in f32 sums.
fn input(world_rank: usize, salt: usize) -> Vec<f32> {
    (0..COUNT)
        .map(|i| ((i * 7 + world_rank * 13 + salt * 5) % 29) as f32 - 14.0)
        .collect()
}

/// An in-place all-reduce (sum) on `comm` of this rank's `input(world_rank, salt)`, checked
/// against the CPU sum over `members` (world ranks).
fn checked_all_reduce(
    api: &Api,
    comm: Comm,
    buf: *mut f32,
    world_rank: usize,
    members: &[usize],
    salt: usize,
    what: &str,
) -> Result<(), String> {
    let mine = input(world_rank, salt);
    // SAFETY: `buf` holds COUNT floats of host-accessible memory (host backend).
    unsafe { std::ptr::copy_nonoverlapping(mine.as_ptr(), buf, COUNT) };
    // SAFETY: in place, COUNT floats; NULL stream: the host backend's own.
    let rc = unsafe {
        (api.all_reduce)(
            buf.cast(),
            buf.cast(),
            COUNT,
            F32,
            SUM,
            comm,
            std::ptr::null_mut(),
        )
    };
    api.expect(&format!("ncclAllReduce on {what}"), rc, SUCCESS)?;
    let mut want = vec![0f32; COUNT];
    for &m in members {
        for (w, v) in want.iter_mut().zip(input(m, salt)) {
            *w += v;
        }
    }
    // SAFETY: as above; the call has returned (host backend: it ran).
    let got = unsafe { std::slice::from_raw_parts(buf, COUNT) };
    let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
    if wrong > 0 {
        return Err(format!(
            "{what}: {wrong} of {COUNT} wrong (first: got {}, want {})",
            got[0], want[0]
        ));
    }
    Ok(())
}

/// One rank of the ProcessGroupNCCL sequence (a child process).
fn torch_rank(rank: usize, dir: &Path) -> Result<(), String> {
    let api = Api::open()?;
    let null = std::ptr::null_mut();
    let id = if rank == 0 {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer.
        api.expect("ncclGetUniqueId", unsafe { (api.get_id)(&mut id) }, SUCCESS)?;
        mark(&dir.join("id"), &id.internal)?;
        id
    } else {
        let b = wait_file(&dir.join("id"))?;
        let mut id = NcclUniqueId { internal: [0; 128] };
        id.internal
            .copy_from_slice(b.get(..128).ok_or("short id file")?);
        id
    };
    let all: Vec<usize> = (0..NRANKS).collect();

    // 1. Non-blocking init: ncclInProgress at once, the handle refused until it is ready.
    let mut cfg = config(0);
    let mut world: Comm = null;
    // SAFETY: valid out-pointer and config.
    let rc = unsafe {
        (api.init_config)(
            &mut world,
            NRANKS as c_int,
            id,
            rank as c_int,
            (&mut cfg as *mut NcclConfig).cast(),
        )
    };
    api.expect("non-blocking ncclCommInitRankConfig", rc, IN_PROGRESS)?;
    if world.is_null() {
        return Err("a non-blocking init wrote no handle".into());
    }
    if rank == 0 {
        // The other ranks start only after this, so this init cannot have completed.
        let mut e = -1;
        // SAFETY: valid out-pointer.
        api.expect(
            "GetAsyncError (pending)",
            // SAFETY: valid out-pointers and live or checked handles (the library checks them).
            unsafe { (api.async_err)(world, &mut e) },
            SUCCESS,
        )?;
        api.expect("the state of a pending init", e, IN_PROGRESS)?;
        let mut n = -1;
        // SAFETY: valid out-pointer.
        api.expect(
            "ncclCommCount while pending",
            // SAFETY: valid out-pointers and live or checked handles (the library checks them).
            unsafe { (api.count)(world, &mut n) },
            INVALID_ARGUMENT,
        )?;
        if !api
            .last()
            .contains("before the previous operation returned ncclSuccess")
        {
            return Err(format!("pending-use message: {}", api.last()));
        }
        mark(&dir.join("pending-checked"), b"")?;
    } else {
        wait_file(&dir.join("pending-checked"))?;
    }
    api.expect("init's final state", api.wait_ready(world)?, SUCCESS)?;
    if api.count_of(world)? != (NRANKS, rank) {
        return Err(format!("world: {:?}", api.count_of(world)?));
    }
    let buf = api.alloc(COUNT)?;
    checked_all_reduce(&api, world, buf, rank, &all, 1, "world")?;

    // 2. Non-blocking split into halves by parity, keys reversed: parent and child are polled.
    let color = (rank % 2) as c_int;
    let mut half: Comm = null;
    // SAFETY: valid out-pointers; config as above.
    let rc = unsafe {
        (api.split)(
            world,
            color,
            -(rank as c_int),
            &mut half,
            (&mut cfg as *mut NcclConfig).cast(),
        )
    };
    api.expect("non-blocking ncclCommSplit", rc, IN_PROGRESS)?;
    api.expect("parent after the split", api.wait_ready(world)?, SUCCESS)?;
    api.expect("child of the split", api.wait_ready(half)?, SUCCESS)?;
    let members: Vec<usize> = all.iter().copied().filter(|r| r % 2 == rank % 2).collect();
    // Reversed keys: the highest world rank of the half is its rank 0.
    let want_rank = members.len() - 1 - members.iter().position(|&m| m == rank).unwrap_or(0);
    if api.count_of(half)? != (members.len(), want_rank) {
        return Err(format!(
            "half: {:?}, want ({}, {want_rank})",
            api.count_of(half)?,
            members.len()
        ));
    }
    checked_all_reduce(&api, half, buf, rank, &members, 2, "half")?;
    checked_all_reduce(&api, world, buf, rank, &all, 3, "world after the split")?;

    // 3. A blocking split that leaves rank 3 out (NOCOLOR: NULL), with a config asking to block.
    let mut blocking = config(1);
    let mut trio: Comm = 0x1 as Comm;
    let c = if rank == 3 { NOCOLOR } else { 5 };
    // SAFETY: as above.
    let rc = unsafe {
        (api.split)(
            world,
            c,
            0,
            &mut trio,
            (&mut blocking as *mut NcclConfig).cast(),
        )
    };
    api.expect("blocking ncclCommSplit", rc, SUCCESS)?;
    if rank == 3 {
        if !trio.is_null() {
            return Err(format!("NCCL_SPLIT_NOCOLOR gave {trio:p}"));
        }
    } else {
        checked_all_reduce(&api, trio, buf, rank, &[0, 1, 2], 4, "trio")?;
        // SAFETY: live handle.
        api.expect(
            "ncclCommDestroy(trio)",
            // SAFETY: valid out-pointers and live or checked handles (the library checks them).
            unsafe { (api.destroy)(trio) },
            SUCCESS,
        )?;
    }

    // 4. Shrink rank 1 away while it lives; blocking by config. Rank 1 calls too and gets
    //    NULL: a live rank that skipped it would number its later splits of `world`
    //    differently from the others (the bootstrap counts a communicator's splits).
    let mut ex = [1 as c_int];
    let mut small: Comm = 0x1 as Comm;
    // SAFETY: one excluded rank; valid out-pointer and config.
    let rc = unsafe {
        (api.shrink)(
            world,
            ex.as_mut_ptr(),
            1,
            &mut small,
            (&mut blocking as *mut NcclConfig).cast(),
            0,
        )
    };
    api.expect("ncclCommShrink", rc, SUCCESS)?;
    if rank == 1 && !small.is_null() {
        return Err(format!("the excluded rank got {small:p}"));
    }
    if rank != 1 {
        let survivors = [0usize, 2, 3];
        let want = survivors.iter().position(|&s| s == rank).unwrap_or(9);
        if api.count_of(small)? != (3, want) {
            return Err(format!("shrunk: {:?}", api.count_of(small)?));
        }
        checked_all_reduce(&api, small, buf, rank, &survivors, 5, "shrunk")?;
        // SAFETY: live handle.
        api.expect(
            "ncclCommAbort(shrunk)",
            // SAFETY: valid out-pointers and live or checked handles (the library checks them).
            unsafe { (api.abort)(small) },
            SUCCESS,
        )?;
    }
    checked_all_reduce(&api, world, buf, rank, &all, 6, "world after the shrink")?;

    // 5. Non-blocking finalize of the child, then destroy; the finalized handle refuses work.
    // SAFETY: live handle.
    let rc = unsafe { (api.finalize)(half) };
    api.expect("non-blocking ncclCommFinalize", rc, IN_PROGRESS)?;
    api.expect("finalize's end", api.wait_ready(half)?, SUCCESS)?;
    // SAFETY: a finalized handle: the library refuses the call before touching the buffer.
    let rc = unsafe { (api.all_reduce)(buf.cast(), buf.cast(), COUNT, F32, SUM, half, null) };
    api.expect("ncclAllReduce after finalize", rc, INVALID_USAGE)?;
    // SAFETY: live handle, then stale.
    unsafe {
        api.expect("ncclCommDestroy(half)", (api.destroy)(half), SUCCESS)?;
        api.expect(
            "ncclCommDestroy(half) twice",
            (api.destroy)(half),
            INVALID_ARGUMENT,
        )?;
    }

    // 6. Rank 3 dies; the others see ncclRemoteError, shrink it away with NCCL_SHRINK_ABORT
    //    and go on.
    mark(&dir.join(format!("before-death-{rank}")), b"")?;
    if rank == 3 {
        for r in 0..3 {
            wait_file(&dir.join(format!("before-death-{r}")))?;
        }
        mark(&dir.join("done-3"), b"")?;
        // No destructors: the bootstrap's connections end without a goodbye, as in a crash.
        std::process::exit(0);
    }
    api.expect(
        "the world once rank 3 died",
        api.wait_ready(world).map(|e| {
            if e == SUCCESS {
                // The death may not have been seen yet: wait for it.
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let mut e = -1;
                    // SAFETY: valid out-pointer.
                    unsafe { (api.async_err)(world, &mut e) };
                    if e != SUCCESS || Instant::now() > deadline {
                        return e;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            e
        })?,
        REMOTE_ERROR,
    )?;
    if !api.last().contains("rank 3") {
        return Err(format!("the dead rank is not named: {}", api.last()));
    }
    let mut ex = [3 as c_int];
    let mut alive: Comm = null;
    // SAFETY: as above.
    let rc = unsafe {
        (api.shrink)(
            world,
            ex.as_mut_ptr(),
            1,
            &mut alive,
            (&mut blocking as *mut NcclConfig).cast(),
            SHRINK_ABORT,
        )
    };
    api.expect(
        "ncclCommShrink(NCCL_SHRINK_ABORT) of the dead rank",
        rc,
        SUCCESS,
    )?;
    checked_all_reduce(&api, alive, buf, rank, &[0, 1, 2], 7, "survivors")?;
    // SAFETY: live handles.
    unsafe {
        api.expect("ncclCommDestroy(survivors)", (api.destroy)(alive), SUCCESS)?;
        api.expect("ncclCommAbort(world)", (api.abort)(world), SUCCESS)?;
    }
    mark(&dir.join(format!("done-{rank}")), b"")
}

fn torch_sequence() -> Result<(), Failed> {
    lib_path()?;
    let dir = fresh_dir("lifecycle")?;
    let mut children = Vec::new();
    for rank in 0..NRANKS {
        let child = rank_command(ROLE_VAR, DIR_VAR, rank, &dir)?
            .env_remove("NCCL_COMM_BLOCKING")
            .spawn()
            .map_err(|e| format!("spawning rank {rank}: {e}"))?;
        children.push(child);
    }
    let failures = reap(children, Duration::from_secs(120));
    let mut failures = failures;
    for rank in 0..NRANKS {
        if failures.is_empty() && !dir.join(format!("done-{rank}")).exists() {
            failures.push(format!("rank {rank} exited without finishing"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

/// Waits for every child within `limit` (killing what is left) and lists the failures.
fn reap(children: Vec<std::process::Child>, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut failures = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        match wait_or_kill(child, deadline, Duration::from_millis(20)) {
            Ok((out, killed)) => {
                if killed {
                    failures.push(format!("rank {rank}: killed at the deadline (a hang)"));
                }
                if !out.status.success() {
                    failures.push(rank_failure(rank, &out));
                }
            }
            Err(e) => failures.push(format!("rank {rank}: {e}")),
        }
    }
    failures
}

/// A communicator handle crossing to a worker thread: the library's handles are plain numbers.
#[derive(Clone, Copy)]
struct SendComm(Comm);
// SAFETY: an `ncclComm_t` of this library is a serial number, valid from any thread.
unsafe impl Send for SendComm {}
#[derive(Clone, Copy)]
struct SendBuf(*mut f32);
// SAFETY: a buffer of ncclMemAlloc, used by one thread at a time.
unsafe impl Send for SendBuf {}

/// All-reduces on every communicator of one process at once (one thread each: on the host
/// backend a collective runs before its call returns, so one thread cannot drive several).
fn all_reduce_each(api: &Api, comms: &[Comm], salt: usize) -> Result<(), String> {
    let n = comms.len();
    let members: Vec<usize> = (0..n).collect();
    let bufs: Vec<SendBuf> = (0..n)
        .map(|_| api.alloc(COUNT).map(SendBuf))
        .collect::<Result<_, _>>()?;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .zip(&bufs)
            .enumerate()
            .map(|(r, (&c, &b))| {
                let (c, b, members) = (SendComm(c), b, &members);
                s.spawn(move || {
                    let (c, b) = (c, b);
                    let (count, me) = api.count_of(c.0)?;
                    if (count, me) != (n, r) {
                        return Err(format!("comm {r}: count/rank {count}/{me}"));
                    }
                    checked_all_reduce(api, c.0, b.0, r, members, salt, &format!("comm {r}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| "a rank thread panicked".to_string())?)
            .collect::<Result<Vec<()>, String>>()
    })?;
    Ok(())
}

fn destroy_all(api: &Api, comms: &[Comm]) -> Result<(), String> {
    for &c in comms {
        api.expect(
            "ncclGetAsyncError before destroy",
            api.wait_ready(c)?,
            SUCCESS,
        )?;
        // SAFETY: live handle.
        api.expect("ncclCommDestroy", unsafe { (api.destroy)(c) }, SUCCESS)?;
    }
    Ok(())
}

/// nccl-tests' single-process set-ups, in one child process (nothing here may leak into the
/// test runner's own library state).
fn inproc_main() -> Result<(), String> {
    let api = Api::open()?;
    let null: Comm = std::ptr::null_mut();

    // a. initComms of nccl-tests: a group of ncclCommInitRankConfig from one thread.
    let n = 3;
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    api.expect("ncclGetUniqueId", unsafe { (api.get_id)(&mut id) }, SUCCESS)?;
    let mut cfg = NcclConfig::INITIALIZER;
    let mut comms = vec![null; n];
    // SAFETY: balanced group; valid out-pointers and config.
    unsafe {
        api.expect("ncclGroupStart", (api.group_start)(), SUCCESS)?;
        for (r, c) in comms.iter_mut().enumerate() {
            let rc = (api.init_config)(
                c,
                n as c_int,
                id,
                r as c_int,
                (&mut cfg as *mut NcclConfig).cast(),
            );
            api.expect("ncclCommInitRankConfig inside a group", rc, SUCCESS)?;
        }
        api.expect("ncclGroupEnd after the inits", (api.group_end)(), SUCCESS)?;
    }
    all_reduce_each(&api, &comms, 1)?;
    destroy_all(&api, &comms)?;

    // b. The same with plain ncclCommInitRank and ncclCommInitRankScalable (two ids).
    let mut ids = [
        NcclUniqueId { internal: [0; 128] },
        NcclUniqueId { internal: [0; 128] },
    ];
    // SAFETY: valid out-pointers.
    unsafe {
        api.expect("ncclGetUniqueId", (api.get_id)(&mut ids[0]), SUCCESS)?;
        api.expect("ncclGetUniqueId", (api.get_id)(&mut ids[1]), SUCCESS)?;
    }
    let mut comms = vec![null; 2];
    // SAFETY: balanced group; valid out-pointers; two ids.
    unsafe {
        api.expect("ncclGroupStart", (api.group_start)(), SUCCESS)?;
        let rc = (api.init)(&mut comms[0], 2, ids[0], 0);
        api.expect("ncclCommInitRank inside a group", rc, SUCCESS)?;
        let rc = (api.init_scalable)(
            &mut comms[1],
            2,
            1,
            2,
            ids.as_mut_ptr(),
            std::ptr::null_mut(),
        );
        api.expect("ncclCommInitRankScalable inside a group", rc, SUCCESS)?;
        api.expect("ncclGroupEnd", (api.group_end)(), SUCCESS)?;
    }
    all_reduce_each(&api, &comms, 2)?;
    destroy_all(&api, &comms)?;

    // c. ncclCommInitAll: NULL devlist; one device listed twice; more ranks than devices.
    for (ndev, devlist) in [(4usize, None), (2, Some(vec![0, 0])), (10, None)] {
        let mut comms = vec![null; ndev];
        let dl = devlist
            .as_ref()
            .map_or(std::ptr::null(), |d: &Vec<c_int>| d.as_ptr());
        // SAFETY: room for ndev handles; devlist NULL or ndev ints.
        let rc = unsafe { (api.init_all)(comms.as_mut_ptr(), ndev as c_int, dl) };
        api.expect(
            &format!("ncclCommInitAll({ndev}, {devlist:?})"),
            rc,
            SUCCESS,
        )?;
        if ndev <= 8 {
            all_reduce_each(&api, &comms, 3)?;
        } else {
            for (r, &c) in comms.iter().enumerate() {
                if api.count_of(c)? != (ndev, r) {
                    return Err(format!(
                        "init-all of {ndev}: comm {r} is {:?}",
                        api.count_of(c)?
                    ));
                }
            }
        }
        destroy_all(&api, &comms)?;
    }

    // d. Refusals: a device that does not exist; ndev 0; a config without its magic; a
    //    non-blocking init inside a group ends the group with ncclInProgress.
    let mut one = [null];
    let bad = [99 as c_int];
    // SAFETY: one slot, one device.
    let rc = unsafe { (api.init_all)(one.as_mut_ptr(), 1, bad.as_ptr()) };
    api.expect("ncclCommInitAll on device 99", rc, INVALID_ARGUMENT)?;
    // SAFETY: nothing is written for ndev 0.
    api.expect(
        "ncclCommInitAll(0)",
        // SAFETY: valid out-pointers and live or checked handles (the library checks them).
        unsafe { (api.init_all)(one.as_mut_ptr(), 0, std::ptr::null()) },
        INVALID_ARGUMENT,
    )?;
    let mut garbage = NcclConfig::INITIALIZER;
    garbage.magic = 0x1234;
    let mut c = null;
    // SAFETY: a full struct with a wrong magic: refused before any use.
    let rc =
        unsafe { (api.init_config)(&mut c, 1, id, 0, (&mut garbage as *mut NcclConfig).cast()) };
    api.expect(
        "ncclCommInitRankConfig without the magic",
        rc,
        INVALID_ARGUMENT,
    )?;
    let mut id1 = NcclUniqueId { internal: [0; 128] };
    let mut nb = config(0);
    // SAFETY: valid out-pointers; balanced group.
    unsafe {
        api.expect("ncclGetUniqueId", (api.get_id)(&mut id1), SUCCESS)?;
        api.expect("ncclGroupStart", (api.group_start)(), SUCCESS)?;
        let rc = (api.init_config)(&mut c, 1, id1, 0, (&mut nb as *mut NcclConfig).cast());
        api.expect("non-blocking init inside a group", rc, SUCCESS)?;
        let rc = (api.group_end)();
        if rc != IN_PROGRESS && rc != SUCCESS {
            return Err(format!(
                "ncclGroupEnd of a non-blocking init: {rc} ({})",
                api.last()
            ));
        }
    }
    api.expect(
        "the one-rank non-blocking init",
        api.wait_ready(c)?,
        SUCCESS,
    )?;
    // SAFETY: live handle.
    api.expect("ncclCommDestroy", unsafe { (api.destroy)(c) }, SUCCESS)?;
    println!("in-process sequences passed");
    Ok(())
}

fn nccl_tests_sequence() -> Result<(), Failed> {
    lib_path()?;
    let child = self_command()?
        .env(INPROC_VAR, "1")
        .env("MSCCLPP_BACKEND", "host")
        .env("MSCCLPP_BOOTSTRAP_TIMEOUT", "30")
        .env_remove("NCCL_COMM_BLOCKING")
        .spawn()
        .map_err(|e| e.to_string())?;
    let failures = reap(vec![child], Duration::from_secs(120));
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

fn main() {
    if std::env::var_os(INPROC_VAR).is_some() {
        match inproc_main() {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }
    run_if_rank(ROLE_VAR, DIR_VAR, torch_rank);
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![
        Trial::test(
            "lifecycle::host::nccl_tests_single_process",
            nccl_tests_sequence,
        ),
        Trial::test(
            "lifecycle::host::process_group_nccl_4_ranks",
            torch_sequence,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
