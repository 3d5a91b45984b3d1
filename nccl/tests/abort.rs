//! A rank killed (SIGKILL) while 4 ranks loop on `ncclAllReduce` through the C ABI on the host
//! backend: every survivor's `ncclCommGetAsyncError` turns `ncclRemoteError` within a few
//! seconds with `ncclGetLastError` naming the dead rank, and `ncclCommAbort`, called from
//! another thread than the one in `ncclAllReduce`, frees the communicator without waiting.
//! Runs with `cargo test -p mscclpp-nccl --test abort -- --nocapture`.
//!
//! `abort::pending_init_is_cancelled`: two non-blocking inits of a 3-rank communicator whose
//! third rank never comes, each aborted from the test's thread while it waits to join (one
//! running the bootstrap root, one waiting on it): each `ncclCommAbort` returns within seconds
//! (not at the bootstrap's 60 s deadline), the handles are gone, and a new communicator can be
//! made after (NVIDIA/nccl#289).
//!
//! The GPU trials (`abort::cuda::*`, `abort::rocm::*`; ignored, with the reason, where the backend
//! cannot be probed) do the same with 2 ranks on the GPUs there are (both on device 0: the
//! library takes the current device), rank 1 killed while rank 0's all-reduce kernels wait for
//! it: the kernels must give up on the communicator's abort word (no trap), the survivor must see
//! `ncclRemoteError` naming rank 1 within 2 s, `ncclCommAbort` must free the thread in
//! `ncclAllReduce`, and the device must still work afterwards (a synchronisation, an allocation,
//! a copy read back): `cargo test -p mscclpp-nccl --features cuda --test abort -- cuda::`.

#[macro_use]
mod support;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use libtest_mimic::{Completion, Failed, Trial};
use mscclpp::hal::{BackendKind, MemoryKind};
use mscclpp_nccl::abi::{NcclConfig, NcclUniqueId};
use support::{
    CollFn, Comm, fresh_dir, lib_path, open_lib, publish, read_id, run_if_rank, self_command,
    wait_or_kill,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_ABORT_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_ABORT_TEST_DIR";
const NRANKS_VAR: &str = "MSCCLPP_NCCL_ABORT_TEST_NRANKS";
const NCCL_REMOTE_ERROR: c_int = 6;
/// The target is 2 s; CI machines are slow, so the assertion leaves room (times are printed).
const REPORT_DEADLINE: Duration = Duration::from_secs(5);
/// The GPU trials' bound from the kill to the survivor's report (the target).
const GPU_REPORT_DEADLINE: Duration = Duration::from_secs(2);
/// How long ranks may take to get ready: on GPUs the first all-reduce compiles its kernels
/// (NVRTC or hipRTC; tens of seconds with a cold kernel cache).
const READY_DEADLINE: Duration = Duration::from_secs(300);

fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// A communicator handle crossing to the worker thread: the library's handles are plain
/// numbers, valid from any thread.
#[derive(Clone, Copy)]
struct SendComm(Comm);
// SAFETY: an `ncclComm_t` of this library is a serial number, not a pointer to thread-bound
// state; every export may be called with it from any thread.
unsafe impl Send for SendComm {}

fn rank_main(rank: usize, n: usize, dir: &Path) -> Result<(), String> {
    let lib = open_lib()?;
    let get_id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
    let init = sym!(
        lib,
        "ncclCommInitRank",
        fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
    );
    let async_f = sym!(lib, "ncclCommGetAsyncError", fn(Comm, *mut c_int) -> c_int);
    let abort = sym!(lib, "ncclCommAbort", fn(Comm) -> c_int);
    let mem_alloc = sym!(lib, "ncclMemAlloc", fn(*mut *mut c_void, usize) -> c_int);
    let last_err = sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char);
    let all_reduce = sym!(lib, "ncclAllReduce" as CollFn);
    let id = if rank == 0 {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer.
        let rc = unsafe { get_id(&mut id) };
        if rc != 0 {
            return Err(format!("ncclGetUniqueId: {rc}"));
        }
        publish(dir, &id.internal)?;
        id
    } else {
        read_id(dir)?
    };
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { init(&mut comm, n as c_int, id, rank as c_int) };
    if rc != 0 {
        return Err(format!("ncclCommInitRank: {rc}"));
    }
    const COUNT: usize = 1024;
    let mut buf: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { mem_alloc(&mut buf, COUNT * 4) };
    if rc != 0 {
        return Err(format!("ncclMemAlloc: {rc}"));
    }
    let buf = buf as usize;
    // One call before "ready": on GPUs it compiles and loads the kernels, so that the kill finds
    // the survivors' kernels running, not the compiler.
    // SAFETY: a device buffer of COUNT floats, live for the process; a live handle.
    let rc = unsafe {
        all_reduce(
            buf as *const c_void,
            buf as *mut c_void,
            COUNT,
            7, // ncclFloat32
            0, // ncclSum
            comm,
            std::ptr::null_mut(),
        )
    };
    if rc != 0 {
        return Err(format!("the first ncclAllReduce: {rc}"));
    }
    std::fs::write(dir.join(format!("ready-{rank}")), b"").map_err(|e| e.to_string())?;
    // The collective loop runs on a worker; this thread watches the asynchronous error and
    // aborts, as a framework's watchdog does.
    let last_rc = Arc::new(AtomicI32::new(0));
    let worker = {
        let last_rc = Arc::clone(&last_rc);
        let c = SendComm(comm);
        std::thread::spawn(move || {
            let c = c;
            loop {
                // SAFETY: a device buffer of COUNT floats, live for the process; the handle is
                // checked by the library (a destroyed one is an error, not a crash).
                let rc = unsafe {
                    all_reduce(
                        buf as *const c_void,
                        buf as *mut c_void,
                        COUNT,
                        7, // ncclFloat32
                        0, // ncclSum
                        c.0,
                        std::ptr::null_mut(),
                    )
                };
                if rc != 0 {
                    last_rc.store(rc, Ordering::Release);
                    return;
                }
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut ae = 0;
        // SAFETY: live communicator, valid out-pointer.
        let rc = unsafe { async_f(comm, &mut ae) };
        if rc != 0 {
            return Err(format!("ncclCommGetAsyncError: {rc}"));
        }
        if ae != 0 {
            let at = unix_us();
            // SAFETY: the library's thread-local NUL-terminated message.
            let msg = unsafe { CStr::from_ptr(last_err(comm)) }
                .to_string_lossy()
                .into_owned();
            println!("REPORT failed_at_unix_us={at}");
            println!("REPORT async={ae}");
            println!("REPORT error={}", msg.replace('\n', " "));
            break;
        }
        if Instant::now() > deadline {
            return Err("no asynchronous error within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // From this thread, while the worker may still be inside ncclAllReduce.
    // SAFETY: a live handle, aborted once.
    let rc = unsafe { abort(comm) };
    println!("REPORT abort={rc}");
    let joined_by = Instant::now() + Duration::from_secs(10);
    while !worker.is_finished() {
        if Instant::now() > joined_by {
            return Err("ncclAllReduce did not return after ncclCommAbort".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = worker.join();
    println!("REPORT worker_rc={}", last_rc.load(Ordering::Acquire));
    if let Some(kind) = gpu_backend() {
        println!("REPORT device_after={}", device_after(kind));
    }
    // A survivor exits non-zero: its job lost a rank.
    Err("a rank died".into())
}

/// The GPU backend the ranks run on (`MSCCLPP_BACKEND`), `None` on the host backend.
fn gpu_backend() -> Option<BackendKind> {
    let kind: BackendKind = std::env::var("MSCCLPP_BACKEND").ok()?.parse().ok()?;
    (kind != BackendKind::Host).then_some(kind)
}

/// Whether device 0 (the library's) still works after the failure ("ok", else what failed),
/// through this binary's own copy of the backend: a kernel of the library that trapped would
/// have left the process's context unusable (every later call fails).
fn device_after(kind: BackendKind) -> String {
    let check = || -> Result<(), String> {
        let e = |x: mscclpp::Error| x.to_string();
        let device = mscclpp::registry::probe(kind)
            .and_then(|b| b.open_device(0))
            .map_err(e)?;
        let stream = device.create_stream().map_err(e)?;
        stream.synchronize().map_err(e)?;
        let a = device.alloc(4096, MemoryKind::Device).map_err(e)?;
        let b = device.alloc(4096, MemoryKind::Device).map_err(e)?;
        stream
            .write_from_host(&a.full(), &[0x5a; 4096])
            .map_err(e)?;
        stream.copy(&b.full(), &a.full()).map_err(e)?;
        let mut back = vec![0u8; 4096];
        stream.read_to_host(&mut back, &b.full()).map_err(e)?;
        stream.synchronize().map_err(e)?;
        if back.iter().any(|&x| x != 0x5a) {
            return Err("a copy after the failure read back wrong bytes".into());
        }
        Ok(())
    };
    match check() {
        Ok(()) => "ok".into(),
        Err(err) => err.replace('\n', " "),
    }
}

/// `n` ranks on `kind`, rank `victim` killed mid-loop.
fn killed_rank_reaches_the_c_api(kind: BackendKind, n: usize, victim: usize) -> Result<(), Failed> {
    let gpu = kind != BackendKind::Host;
    lib_path()?;
    let dir = fresh_dir(&format!("abort-{kind}"))?;
    let mut children: Vec<Child> = (0..n)
        .map(|rank| {
            let mut cmd = self_command()?;
            if gpu {
                // A rank that compiled its kernels first waits for the others in the first call.
                cmd.env(
                    "MSCCLPP_BOOTSTRAP_TIMEOUT",
                    READY_DEADLINE.as_secs().to_string(),
                );
            } else {
                cmd.env_remove("MSCCLPP_BOOTSTRAP_TIMEOUT");
            }
            cmd.env(ROLE_VAR, rank.to_string())
                .env(NRANKS_VAR, n.to_string())
                .env(DIR_VAR, &dir)
                .env("MSCCLPP_BACKEND", kind.to_string())
                .env_remove("MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION")
                .spawn()
                .map_err(|e| format!("spawning rank {rank}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let ready_within = if gpu {
        READY_DEADLINE
    } else {
        Duration::from_secs(60)
    };
    let ready_by = Instant::now() + ready_within;
    while (0..n).any(|r| !dir.join(format!("ready-{r}")).exists()) {
        if Instant::now() > ready_by {
            children.iter_mut().for_each(|c| {
                let _ = c.kill();
            });
            return Err(format!("ranks did not get ready within {ready_within:?}").into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(if gpu { 500 } else { 200 }));
    children[victim].kill().map_err(|e| e.to_string())?;
    let killed_at = unix_us();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut problems = Vec::new();
    let mut times = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let (out, killed) = wait_or_kill(child, deadline, Duration::from_millis(5))?;
        if killed {
            problems.push(format!("rank {rank} hung"));
        }
        if rank == victim {
            continue;
        }
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let get = |k: &str| {
            stdout
                .lines()
                .filter_map(|l| l.strip_prefix("REPORT "))
                .filter_map(|l| l.split_once('='))
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_owned())
        };
        let describe = || {
            format!(
                "rank {rank} ({}):\n{stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        };
        if out.status.success() || out.status.code().is_none() {
            problems.push(format!("exited 0 or by a signal: {}", describe()));
            continue;
        }
        let error = get("error").unwrap_or_default();
        if get("async").as_deref() != Some(&NCCL_REMOTE_ERROR.to_string())
            || !error.contains(&format!("rank {victim}"))
            || get("abort").as_deref() != Some("0")
            || get("worker_rc").is_none_or(|r| r == "0")
        {
            problems.push(format!(
                "not ncclRemoteError naming rank {victim}, aborted, worker failed: {}",
                describe()
            ));
            continue;
        }
        let took = get("failed_at_unix_us")
            .and_then(|v| v.parse::<u128>().ok())
            .map_or(Duration::MAX, |t| {
                Duration::from_micros(t.saturating_sub(killed_at) as u64)
            });
        let bound = if gpu {
            GPU_REPORT_DEADLINE
        } else {
            REPORT_DEADLINE
        };
        if took > bound {
            problems.push(format!("rank {rank} took {took:?} (bound {bound:?})"));
        }
        if gpu && get("device_after").as_deref() != Some("ok") {
            problems.push(format!(
                "rank {rank}'s device after the failure: {}",
                get("device_after").unwrap_or_else(|| "not reported".into())
            ));
        }
        times.push(format!("r{rank} {:.0} ms", took.as_secs_f64() * 1e3));
        if times.len() == 1 {
            eprintln!("    e.g. rank {rank}: {error}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "    C API ({kind}): survivors saw ncclRemoteError after {}",
        times.join(", ")
    );
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n").into())
    }
}

/// Threads of this process running a communicator creation (named `nccl-init`).
fn init_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "nccl-init")
        })
        .count()
}

fn pending_init_is_cancelled() -> Result<(), Failed> {
    const IN_PROGRESS: c_int = 7;
    let lib = open_lib()?;
    let get_id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
    let init = sym!(
        lib,
        "ncclCommInitRankConfig",
        fn(*mut Comm, c_int, NcclUniqueId, c_int, *mut NcclConfig) -> c_int
    );
    let abort = sym!(lib, "ncclCommAbort", fn(Comm) -> c_int);
    let destroy = sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int);
    let async_err = sym!(lib, "ncclCommGetAsyncError", fn(Comm, *mut c_int) -> c_int);
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    if unsafe { get_id(&mut id) } != 0 {
        return Err("ncclGetUniqueId failed".into());
    }
    let mut cfg = NcclConfig::INITIALIZER;
    cfg.blocking = 0;
    let mut handles = [std::ptr::null_mut(); 2];
    for (rank, h) in handles.iter_mut().enumerate() {
        // SAFETY: valid pointers.
        let rc = unsafe { init(h, 3, id, rank as c_int, &mut cfg) };
        if rc != IN_PROGRESS || h.is_null() {
            return Err(
                format!("non-blocking init of rank {rank}: code {rc}, handle {h:p}").into(),
            );
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    if init_threads() != 2 {
        return Err(format!("{} init threads run, expected 2", init_threads()).into());
    }
    for (rank, &h) in handles.iter().enumerate() {
        let mut e = -1;
        // SAFETY: valid out-pointer.
        let rc = unsafe { async_err(h, &mut e) };
        if rc != 0 || e != IN_PROGRESS {
            return Err(format!("rank {rank} without its third rank: code {rc}, state {e}").into());
        }
    }
    for (rank, &h) in handles.iter().enumerate().rev() {
        let t = Instant::now();
        // SAFETY: a pending handle of this library.
        let rc = unsafe { abort(h) };
        let took = t.elapsed();
        println!("abort of rank {rank}'s pending init returned {rc} in {took:?}");
        if rc != 0 || took > Duration::from_secs(5) {
            return Err(format!(
                "ncclCommAbort of rank {rank}'s pending init: code {rc} after {took:?}"
            )
            .into());
        }
        let mut e = -1;
        // SAFETY: as above; the handle is gone, which must be refused, not crash.
        let rc = unsafe { async_err(h, &mut e) };
        if rc != 4 {
            return Err(
                format!("the aborted handle of rank {rank} is still answered: code {rc}").into(),
            );
        }
    }
    // The creations' threads have ended (they would wait for the third rank until the
    // bootstrap's deadline if the aborts had only dropped the handles).
    // (A thread that finished its job may take a moment to exit.)
    let until = Instant::now() + Duration::from_secs(2);
    while init_threads() != 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let left = init_threads();
    if left != 0 {
        return Err(format!("{left} init threads still run after the aborts").into());
    }
    // A communicator can be made after.
    // SAFETY: valid out-pointer.
    if unsafe { get_id(&mut id) } != 0 {
        return Err("ncclGetUniqueId after the aborts failed".into());
    }
    let mut one: Comm = std::ptr::null_mut();
    let mut blocking = NcclConfig::INITIALIZER;
    blocking.blocking = 1;
    // SAFETY: valid pointers; one rank joins at once.
    let rc = unsafe { init(&mut one, 1, id, 0, &mut blocking) };
    // SAFETY: the communicator just made.
    if rc != 0 || unsafe { destroy(one) } != 0 {
        return Err(format!("a 1-rank init after the aborts: code {rc}").into());
    }
    Ok(())
}

fn main() {
    run_if_rank(ROLE_VAR, DIR_VAR, |rank, dir| {
        let n: usize = std::env::var(NRANKS_VAR)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        rank_main(rank, n, dir)
    });
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = vec![
        Trial::test("abort::killed_rank_reaches_the_c_api", || {
            killed_rank_reaches_the_c_api(BackendKind::Host, 4, 2)
        }),
        Trial::test(
            "abort::pending_init_is_cancelled",
            pending_init_is_cancelled,
        ),
    ];
    for kind in [BackendKind::Cuda, BackendKind::Rocm] {
        trials.push(Trial::ignorable_test(
            format!("abort::{kind}::killed_rank_reaches_the_c_api"),
            move || {
                if let Err(reason) = mscclpp::registry::probe(kind) {
                    return Ok(Completion::ignored_with(support::ignore_reason(reason)));
                }
                killed_rank_reaches_the_c_api(kind, 2, 1).map(|()| Completion::Completed)
            },
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}
