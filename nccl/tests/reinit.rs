//! Communicators whose life does not follow one thread, and processes that make several in a
//! row, through the C ABI on the host backend (every all-reduce checked against a CPU sum):
//!
//! - **threads that exit** (nccl-tests `-p 1`): each rank creates its communicators on threads
//!   that end before the communicators are used; one is used from the main thread and destroyed
//!   from yet another thread, the other is left alive when the process exits — and the peer
//!   exits only once this rank has begun to exit, so that this rank learns of the death while
//!   its exit handlers run. `MSCCLPP_HOST_EXIT_TEARDOWN=1` makes the host backend's memory
//!   inaccessible at exit, as a GPU runtime's teardown does: a background thread that touched it
//!   then would kill the process with SIGSEGV (the crash nccl-tests `-p 1` showed on GPUs);
//! - **re-initialisation** (PyTorch's `init_process_group` / `destroy_process_group` cycles,
//!   elastic restarts, test suites): 2 and 4 processes make a communicator from a fresh unique id,
//!   all-reduce, tear it down (destroy; abort; non-blocking init, finalize and destroy) and start
//!   again, three times in the same processes; and the same with the last rank reading the
//!   previous cycle's id, as PyTorch's store hands it out when its key repeats after
//!   `destroy_process_group` (the stale rank is sent to the root that replaced the old one).
//!
//! Runs with `cargo test -p mscclpp-nccl --test reinit`.

#[macro_use]
mod support;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};
use mscclpp_nccl::abi::{NcclConfig, NcclUniqueId};
use support::{
    CollFn, Comm, fresh_dir, lib_path, mark, open_lib, rank_command, rank_failure, run_if_rank,
    wait_file, wait_or_kill,
};

const EXIT_ROLE: &str = "MSCCLPP_NCCL_EXIT_TEST_RANK";
const REINIT_ROLE: &str = "MSCCLPP_NCCL_REINIT_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_REINIT_TEST_DIR";
const NRANKS_VAR: &str = "MSCCLPP_NCCL_REINIT_TEST_NRANKS";
const STALE_VAR: &str = "MSCCLPP_NCCL_REINIT_TEST_STALE";
const COUNT: usize = 1000;
const CYCLES: usize = 3;

const SUCCESS: c_int = 0;
const IN_PROGRESS: c_int = 7;
const F32: c_int = 7;
const SUM: c_int = 0;

struct Api {
    _lib: libloading::Library,
    get_id: unsafe extern "C" fn(*mut NcclUniqueId) -> c_int,
    init_config: unsafe extern "C" fn(*mut Comm, c_int, NcclUniqueId, c_int, *mut c_void) -> c_int,
    async_err: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    finalize: unsafe extern "C" fn(Comm) -> c_int,
    destroy: unsafe extern "C" fn(Comm) -> c_int,
    abort: unsafe extern "C" fn(Comm) -> c_int,
    mem_alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int,
    mem_free: unsafe extern "C" fn(*mut c_void) -> c_int,
    all_reduce: CollFn,
    last_err: unsafe extern "C" fn(Comm) -> *const c_char,
}

impl Api {
    fn open() -> Result<Self, String> {
        let lib = open_lib()?;
        Ok(Api {
            get_id: sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int),
            init_config: sym!(
                lib,
                "ncclCommInitRankConfig",
                fn(*mut Comm, c_int, NcclUniqueId, c_int, *mut c_void) -> c_int
            ),
            async_err: sym!(lib, "ncclCommGetAsyncError", fn(Comm, *mut c_int) -> c_int),
            finalize: sym!(lib, "ncclCommFinalize", fn(Comm) -> c_int),
            destroy: sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int),
            abort: sym!(lib, "ncclCommAbort", fn(Comm) -> c_int),
            mem_alloc: sym!(lib, "ncclMemAlloc", fn(*mut *mut c_void, usize) -> c_int),
            mem_free: sym!(lib, "ncclMemFree", fn(*mut c_void) -> c_int),
            all_reduce: sym!(lib, "ncclAllReduce" as CollFn),
            last_err: sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char),
            _lib: lib,
        })
    }

    fn expect(&self, what: &str, got: c_int, want: c_int) -> Result<(), String> {
        if got == want {
            return Ok(());
        }
        // SAFETY: the library's NUL-terminated message of this thread.
        let last = unsafe { CStr::from_ptr((self.last_err)(std::ptr::null_mut())) };
        Err(format!(
            "{what}: returned {got}, expected {want} (last error: {})",
            last.to_string_lossy()
        ))
    }

    /// `ncclCommInitRankConfig` (blocking or not; a non-blocking one polled until ready, as
    /// PyTorch does).
    fn init(
        &self,
        n: usize,
        id: NcclUniqueId,
        rank: usize,
        blocking: bool,
    ) -> Result<Comm, String> {
        let mut cfg = NcclConfig::INITIALIZER;
        cfg.blocking = c_int::from(blocking);
        let mut c: Comm = std::ptr::null_mut();
        // SAFETY: valid out-pointer and config.
        let rc = unsafe {
            (self.init_config)(
                &mut c,
                n as c_int,
                id,
                rank as c_int,
                (&mut cfg as *mut NcclConfig).cast(),
            )
        };
        if blocking {
            self.expect("ncclCommInitRankConfig", rc, SUCCESS)?;
            return Ok(c);
        }
        if rc != SUCCESS && rc != IN_PROGRESS {
            self.expect("non-blocking ncclCommInitRankConfig", rc, IN_PROGRESS)?;
        }
        self.ready(c, "the non-blocking init")?;
        Ok(c)
    }

    /// Polls `ncclCommGetAsyncError` until it is no longer `ncclInProgress`; then it must be
    /// `ncclSuccess`.
    fn ready(&self, c: Comm, what: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut e = -1;
            // SAFETY: valid out-pointer; the handle is checked by the library.
            let rc = unsafe { (self.async_err)(c, &mut e) };
            self.expect("ncclCommGetAsyncError", rc, SUCCESS)?;
            match e {
                IN_PROGRESS if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                _ => return self.expect(&format!("{what}: its result"), e, SUCCESS),
            }
        }
    }

    /// An in-place all-reduce of this rank's input on `c`, checked against the CPU sum.
    fn checked_all_reduce(
        &self,
        c: Comm,
        rank: usize,
        n: usize,
        salt: usize,
    ) -> Result<(), String> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.mem_alloc)(&mut p, COUNT * 4) };
        self.expect("ncclMemAlloc", rc, SUCCESS)?;
        let buf: *mut f32 = p.cast();
        let input = |r: usize| -> Vec<f32> {
            (0..COUNT)
                .map(|i| ((i * 3 + r * 11 + salt * 7) % 23) as f32 - 11.0)
                .collect()
        };
        // SAFETY: `buf` holds COUNT floats of host memory (host backend).
        unsafe { std::ptr::copy_nonoverlapping(input(rank).as_ptr(), buf, COUNT) };
        // SAFETY: in place, COUNT floats; NULL stream: the host backend's own.
        let rc = unsafe {
            (self.all_reduce)(
                buf.cast(),
                buf.cast(),
                COUNT,
                F32,
                SUM,
                c,
                std::ptr::null_mut(),
            )
        };
        self.expect(&format!("ncclAllReduce (salt {salt})"), rc, SUCCESS)?;
        let mut want = vec![0f32; COUNT];
        for r in 0..n {
            for (w, v) in want.iter_mut().zip(input(r)) {
                *w += v;
            }
        }
        // SAFETY: as above; the call has run (host backend).
        let got = unsafe { std::slice::from_raw_parts(buf, COUNT) }.to_vec();
        // SAFETY: our allocation, no longer used.
        self.expect("ncclMemFree", unsafe { (self.mem_free)(p) }, SUCCESS)?;
        let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        if wrong > 0 {
            return Err(format!(
                "all-reduce (salt {salt}): {wrong} of {COUNT} wrong (first: got {}, want {})",
                got[0], want[0]
            ));
        }
        Ok(())
    }
}

/// A handle or id crossing threads: the library's handles are plain numbers.
#[derive(Clone, Copy)]
struct Send<T>(T);
// SAFETY: an `ncclComm_t` of this library is a serial number, usable from any thread; ids are
// plain bytes.
unsafe impl<T> std::marker::Send for Send<T> {}

/// Rank 0 makes the id named `tag` and publishes it; the others read it.
fn shared_id(api: &Api, rank: usize, dir: &Path, tag: &str) -> Result<NcclUniqueId, String> {
    let path = dir.join(format!("id-{tag}"));
    let mut id = NcclUniqueId { internal: [0; 128] };
    if rank == 0 {
        // SAFETY: valid out-pointer.
        api.expect("ncclGetUniqueId", unsafe { (api.get_id)(&mut id) }, SUCCESS)?;
        mark(&path, &id.internal)?;
    } else {
        let b = wait_file(&path)?;
        id.internal
            .copy_from_slice(b.get(..128).ok_or("short id file")?);
    }
    Ok(id)
}

/// The directory the exit handler of rank 0 marks (set before any communicator exists).
static EXIT_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

// SAFETY: C's `atexit`, with this signature.
unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> c_int;
}

/// Registered before the library is used, so it runs after the library's exit handlers and the
/// host backend's teardown: it lets rank 1 exit now and waits for this rank to learn of it.
extern "C" fn slow_exit() {
    if let Some(d) = EXIT_DIR.get() {
        let _ = mark(&d.join("exiting-0"), b"");
        let _ = wait_file(&d.join("gone-1"));
        // The peer's sockets close as it exits; the event loop learns it within milliseconds.
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// One rank of nccl-tests' `-p 1` life: two communicators made on threads that end at once.
fn exit_rank(rank: usize, dir: &Path) -> Result<(), String> {
    if rank == 0 {
        let _ = EXIT_DIR.set(dir.to_path_buf());
        // SAFETY: a plain handler of static lifetime.
        if unsafe { atexit(slow_exit) } != 0 {
            return Err("atexit failed".into());
        }
    }
    // Never unloaded, as a library linked into a program is: the live communicator's threads
    // run its code until the process is gone.
    let api: &'static Api = Box::leak(Box::new(Api::open()?));
    let n = 2;
    let ids = [
        shared_id(api, rank, dir, "a")?,
        shared_id(api, rank, dir, "b")?,
    ];
    let made: Vec<Send<Comm>> = ids
        .iter()
        .map(|id| {
            let id = Send(*id);
            std::thread::scope(|s| {
                s.spawn(move || {
                    let id = id;
                    api.init(n, id.0, rank, true).map(Send)
                })
                .join()
                .map_err(|_| "the init thread panicked".to_string())?
            })
        })
        .collect::<Result<_, _>>()?;
    let (a, b) = (made[0], made[1]);
    // Used from the main thread, and from a new one, after the creating threads ended.
    api.checked_all_reduce(a.0, rank, n, 1)?;
    api.checked_all_reduce(b.0, rank, n, 2)?;
    std::thread::scope(|s| {
        s.spawn(move || {
            let a = a;
            api.checked_all_reduce(a.0, rank, n, 3)
        })
        .join()
        .map_err(|_| "a worker thread panicked".to_string())?
    })?;
    // `a` destroyed from yet another thread; `b` left alive at exit, as nccl-tests -p 1 does.
    std::thread::scope(|s| {
        s.spawn(move || {
            let a = a;
            // SAFETY: a live handle, destroyed once.
            api.expect(
                "ncclCommDestroy from another thread",
                unsafe { (api.destroy)(a.0) },
                SUCCESS,
            )
        })
        .join()
        .map_err(|_| "the destroying thread panicked".to_string())?
    })?;
    if rank == 1 {
        // Exit once rank 0 is inside its exit handlers.
        wait_file(&dir.join("exiting-0"))?;
        // std::process::exit runs the exit handlers here too; the marker tells rank 0 we left.
        mark(&dir.join("gone-1"), b"")?;
    }
    mark(&dir.join(format!("done-{rank}")), b"")
}

/// The id of cycle `cycle` as PyTorch's store hands it out after `destroy_process_group`: its key
/// repeats every cycle, and the last rank reads it before rank 0 has written the new id, so it
/// gets the previous cycle's (rank 0 waits for that read before it makes the new one).
fn stale_read_id(
    api: &Api,
    rank: usize,
    n: usize,
    dir: &Path,
    cycle: usize,
) -> Result<NcclUniqueId, String> {
    if cycle == 0 {
        return shared_id(api, rank, dir, "0");
    }
    let read = dir.join(format!("stale-read-{cycle}"));
    if rank == n - 1 {
        let b = wait_file(&dir.join(format!("id-{}", cycle - 1)))?;
        let mut id = NcclUniqueId { internal: [0; 128] };
        id.internal
            .copy_from_slice(b.get(..128).ok_or("short id file")?);
        mark(&read, b"")?;
        return Ok(id);
    }
    if rank == 0 {
        wait_file(&read)?;
    }
    shared_id(api, rank, dir, &cycle.to_string())
}

/// One rank of the re-initialisation cycles.
fn reinit_rank(rank: usize, dir: &Path) -> Result<(), String> {
    let n: usize = std::env::var(NRANKS_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or("no rank count")?;
    let stale = std::env::var(STALE_VAR).is_ok_and(|v| v == "1");
    let api = Api::open()?;
    for cycle in 0..CYCLES {
        let id = if stale {
            stale_read_id(&api, rank, n, dir, cycle)?
        } else {
            shared_id(&api, rank, dir, &cycle.to_string())?
        };
        let c = api.init(n, id, rank, cycle != 2)?;
        api.checked_all_reduce(c, rank, n, cycle)
            .map_err(|e| format!("cycle {cycle}: {e}"))?;
        // SAFETY: a live handle, released once.
        unsafe {
            match cycle {
                0 => api.expect("ncclCommDestroy", (api.destroy)(c), SUCCESS)?,
                1 => api.expect("ncclCommAbort", (api.abort)(c), SUCCESS)?,
                _ => {
                    // Non-blocking: ncclInProgress until the finalize has run, as PyTorch polls.
                    let rc = (api.finalize)(c);
                    if rc != IN_PROGRESS {
                        api.expect("ncclCommFinalize", rc, SUCCESS)?;
                    }
                    api.ready(c, "ncclCommFinalize")?;
                    api.expect("ncclCommDestroy", (api.destroy)(c), SUCCESS)?;
                }
            }
        }
    }
    mark(&dir.join(format!("done-{rank}")), b"")
}

fn run_ranks(role: &str, n: usize, tag: &str, extra: &[(&str, &str)]) -> Result<(), Failed> {
    lib_path()?;
    let dir = fresh_dir(tag)?;
    let mut children = Vec::new();
    for rank in 0..n {
        let mut cmd = rank_command(role, DIR_VAR, rank, &dir)?;
        cmd.env(NRANKS_VAR, n.to_string())
            .env_remove("NCCL_COMM_BLOCKING");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        children.push(
            cmd.spawn()
                .map_err(|e| format!("spawning rank {rank}: {e}"))?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(120);
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
    for rank in 0..n {
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

fn main() {
    run_if_rank(EXIT_ROLE, DIR_VAR, exit_rank);
    run_if_rank(REINIT_ROLE, DIR_VAR, reinit_rank);
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![
        Trial::test(
            "lifecycle::host::threads_that_exit_and_a_live_communicator_at_exit",
            || run_ranks(EXIT_ROLE, 2, "exit", &[("MSCCLPP_HOST_EXIT_TEARDOWN", "1")]),
        ),
        Trial::test("lifecycle::host::reinit_2_ranks_3_cycles", || {
            run_ranks(REINIT_ROLE, 2, "reinit2", &[])
        }),
        Trial::test("lifecycle::host::reinit_4_ranks_3_cycles", || {
            run_ranks(REINIT_ROLE, 4, "reinit4", &[])
        }),
        // PyTorch under torchrun: a rank reads the previous cycle's unique id from the store.
        Trial::test(
            "lifecycle::host::reinit_2_ranks_stale_id_from_the_store",
            || run_ranks(REINIT_ROLE, 2, "reinit2s", &[(STALE_VAR, "1")]),
        ),
        Trial::test(
            "lifecycle::host::reinit_4_ranks_stale_id_from_the_store",
            || run_ranks(REINIT_ROLE, 4, "reinit4s", &[(STALE_VAR, "1")]),
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
