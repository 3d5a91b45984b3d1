//! A rank that is alive but stops calling (issue 46's hang diagnosis), through the C ABI
//! (`dlopen`, as a C program), three ranks as child processes on the host backend with device
//! waits cut to 3 s (`MSCCLPP_HOST_WAIT`): every rank all-reduces once; ranks 0 and 1 then
//! all-reduce again while rank 2 waits outside the library (until rank 0 has asked the status service). Their call fails within seconds
//! (not hangs), and the error `ncclGetLastError` gives names rank 2 and its last call (call #1,
//! an all-reduce, how long ago), as rank 2's event loop answered the survey; rank 2 itself is
//! not blamed for anything. Rank 0's status service (`MSCCLPP_STATUS`, the address and token
//! appended to `MSCCLPP_STATUS_FILE`) answers within 2 s naming rank 2 as behind, and its
//! completion record (on with the service) says rank 2 finished its call while ranks 0 and 1
//! did not finish their second. The watchdog (`MSCCLPP_WATCHDOG_SECONDS=1`), polled through
//! `ncclCommGetAsyncError` from another thread while the call waits (as PyTorch's watchdog
//! polls), says `ncclRemoteError` within 3 s, its message naming rank 2. Runs with
//! `cargo test -p mscclpp-nccl --test laggard`.

#[macro_use]
mod support;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::time::{Duration, Instant};

use support::{CollFn, Comm, fresh_dir, init_world, lib_path, open_lib, run_if_rank, run_ranks};

const ROLE_VAR: &str = "MSCCLPP_NCCL_LAGGARD_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_LAGGARD_TEST_DIR";
const NRANKS: usize = 3;
const NCCL_FLOAT32: c_int = 7;
const NCCL_SUM: c_int = 0;

fn rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    let lib = open_lib()?;
    let abort = sym!(lib, "ncclCommAbort", fn(Comm) -> c_int);
    let destroy = sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int);
    let last_err = sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char);
    let async_err = sym!(lib, "ncclCommGetAsyncError", fn(Comm, *mut c_int) -> c_int);
    let all_reduce: CollFn = sym!(lib, "ncclAllReduce" as CollFn);
    let comm = init_world(&lib, rank, NRANKS, dir, std::ptr::null_mut())?;
    let mut x = vec![1.0f32; 1024];
    let p = x.as_mut_ptr().cast::<c_void>();
    // SAFETY: `x` in place; the host backend's call has run when it returns.
    let rc = unsafe {
        all_reduce(
            p,
            p,
            x.len(),
            NCCL_FLOAT32,
            NCCL_SUM,
            comm,
            std::ptr::null_mut(),
        )
    };
    if rc != 0 || x[0] != NRANKS as f32 {
        return Err(format!("the first all-reduce: code {rc}, x[0] = {}", x[0]));
    }
    if rank == 2 {
        // Alive, not calling, until rank 0 has asked the status service: the others' surveys
        // are answered by this rank's event loop.
        let until = Instant::now() + Duration::from_secs(30);
        while !dir.join("asked").exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: the communicator made above (its peers gave up on their call).
        unsafe { abort(comm) };
        std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
        return Ok(());
    }
    // The watchdog (MSCCLPP_WATCHDOG_SECONDS=1), polled as PyTorch's polls it, from another
    // thread while the call waits: the first error it says, how soon, and the message.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (stop, comm) = (stop.clone(), comm as usize);
        std::thread::spawn(move || {
            let t = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut e: c_int = 0;
                // SAFETY: a live communicator (aborted only after this thread is joined).
                unsafe { async_err(comm as Comm, &mut e) };
                if e != 0 {
                    // SAFETY: the library's thread-local NUL-terminated message.
                    let msg = unsafe { CStr::from_ptr(last_err(comm as Comm)) };
                    return Some((e, t.elapsed(), msg.to_string_lossy().into_owned()));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            None
        })
    };
    let t = Instant::now();
    // SAFETY: as above.
    let rc = unsafe {
        all_reduce(
            p,
            p,
            x.len(),
            NCCL_FLOAT32,
            NCCL_SUM,
            comm,
            std::ptr::null_mut(),
        )
    };
    let took = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let polled = poller
        .join()
        .map_err(|_| "the poller panicked".to_string())?;
    match &polled {
        Some((6, after, m))
            if *after < Duration::from_millis(2900)
                && m.contains("watchdog: call #2 has not completed after")
                && m.contains("rank 2: call #1 allreduce of 4096 bytes") => {}
        other => {
            return Err(format!(
                "ncclCommGetAsyncError during the stuck call: {other:?} (expected ncclRemoteError \
                 from the watchdog naming rank 2 within 3 s)"
            ));
        }
    }
    // SAFETY: the library's thread-local NUL-terminated message.
    let msg = unsafe { CStr::from_ptr(last_err(std::ptr::null_mut())) }
        .to_string_lossy()
        .into_owned();
    if rc == 0 {
        return Err("the second all-reduce succeeded without rank 2".into());
    }
    if took > Duration::from_secs(7) {
        return Err(format!("the call failed only after {took:?}: {msg}"));
    }
    let names = msg.contains("rank 2: call #1 allreduce of 4096 bytes, issued")
        && msg.contains("behind this rank (call #2)")
        && !msg.contains("rank 1: call")
        && !msg.contains("rank 0: call");
    if !names {
        return Err(format!(
            "the error does not name rank 2 and its last call alone: {msg}"
        ));
    }
    if rank == 0 {
        // The message as a user reads it (the parent prints it).
        std::fs::write(dir.join("message"), &msg).map_err(|e| e.to_string())?;
        // The status service rank 0 started (MSCCLPP_STATUS), asked as `mscclpp-perf status`
        // asks it, with the line it appended to MSCCLPP_STATUS_FILE.
        let line = std::fs::read_to_string(dir.join("status")).map_err(|e| e.to_string())?;
        let mut words = line.split_whitespace().skip(2);
        let (addr, token) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let addr = addr
            .parse()
            .map_err(|e| format!("status line {line:?}: {e}"))?;
        let t = Instant::now();
        let report = mscclpp::comm::bootstrap::ask_status(addr, token, Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        if t.elapsed() > Duration::from_secs(2)
            || !report.contains("rank 2: call #1 allreduce")
            || !report.contains("behind (the most calls is 2): rank 2 (call #1 allreduce")
            // The completion record (on with MSCCLPP_STATUS): rank 2 finished what it issued;
            // ranks 0 and 1 issued a second call that never finished.
            || !report
                .lines()
                .any(|l| l.starts_with("rank 2: call #1 ") && l.ends_with(", completed"))
            || !report
                .lines()
                .any(|l| l.starts_with("rank 1: call #2 ") && l.ends_with("completed through #1"))
        {
            return Err(format!(
                "the status service said, in {:?}:\n{report}",
                t.elapsed()
            ));
        }
        std::fs::write(dir.join("report"), &report).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("asked"), b"").map_err(|e| e.to_string())?;
    } else {
        // Alive until rank 0 has asked the status service (else its report has a gone rank).
        let until = Instant::now() + Duration::from_secs(20);
        while !dir.join("asked").exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // SAFETY: the communicator made above; failed, so aborted rather than destroyed.
    unsafe { abort(comm) };
    let _ = destroy;
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

fn fail(msg: &str) -> ! {
    eprintln!("laggard: {msg}");
    std::process::exit(1)
}

fn main() {
    run_if_rank(ROLE_VAR, DIR_VAR, rank_main);
    if let Err(e) = lib_path() {
        fail(&e);
    }
    let dir = fresh_dir("laggard").unwrap_or_else(|e| fail(&e));
    let ran = run_ranks(
        (ROLE_VAR, DIR_VAR),
        &dir,
        NRANKS,
        Duration::from_secs(120),
        |cmd| {
            cmd.env("MSCCLPP_HOST_WAIT", "3")
                .env("MSCCLPP_WATCHDOG_SECONDS", "1")
                .env("MSCCLPP_STATUS", "127.0.0.1:0")
                .env("MSCCLPP_STATUS_FILE", dir.join("status"));
        },
    );
    let message = std::fs::read_to_string(dir.join("message")).unwrap_or_default();
    let report = std::fs::read_to_string(dir.join("report")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = ran {
        fail(&e);
    }
    println!("laggard: rank 0's error: {message}");
    println!("laggard: the status service's report:\n{report}");
    println!(
        "laggard: 3 ranks on the host backend, rank 2 stops calling: the others' call fails in seconds naming it and its last call"
    );
}
