//! NCCL's debug variables in the C library: `NCCL_DEBUG` levels, `NCCL_DEBUG_SUBSYS` lists
//! (with `^` and `ALL`), `NCCL_DEBUG_FILE` patterns (`%h`, `%p`), `MSCCLPP_LOG_LEVEL`'s
//! precedence, and the environment values communicators refuse at creation. Each case runs
//! ranks of this binary on the host backend with the variables set, and reads what they
//! printed.

#[macro_use]
mod support;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};
use mscclpp_nccl::abi::NcclUniqueId;
use support::*;

const ROLE: &str = "MSCCLPP_NCCL_DEBUG_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_DEBUG_TEST_DIR";
const NRANKS_VAR: &str = "MSCCLPP_NCCL_DEBUG_TEST_NRANKS";
/// `ok`: init must succeed; anything else: init must fail and the rank prints the last error.
const EXPECT_VAR: &str = "MSCCLPP_NCCL_DEBUG_TEST_EXPECT";

/// Every variable these cases set, cleared in the ranks first so that the caller's environment
/// does not leak in.
const CLEARED: &[&str] = &[
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_DEBUG_FILE",
    "MSCCLPP_LOG_LEVEL",
    "MSCCLPP_DEBUG",
    "RUST_LOG",
    "MSCCLPP_NCCL_LIB_PATH",
];

/// One rank: two communicators one after the other (the banner must still print once), an
/// all-reduce on the first, a misuse (`ncclCommCount(NULL)`, a warning), then destroy.
fn rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    let n: usize = std::env::var(NRANKS_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or("no rank count")?;
    let expect_ok = std::env::var(EXPECT_VAR).is_ok_and(|v| v == "ok");
    let lib = open_lib()?;
    let get_id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
    let init = sym!(
        lib,
        "ncclCommInitRank",
        fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
    );
    let count_f = sym!(lib, "ncclCommCount", fn(Comm, *mut c_int) -> c_int);
    let destroy = sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int);
    let mem_alloc = sym!(lib, "ncclMemAlloc", fn(*mut *mut c_void, usize) -> c_int);
    let mem_free = sym!(lib, "ncclMemFree", fn(*mut c_void) -> c_int);
    let last_err = sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char);
    let all_reduce: CollFn = sym!(lib, "ncclAllReduce" as CollFn);
    let last = || {
        // SAFETY: the library's thread-local NUL-terminated message.
        unsafe { CStr::from_ptr(last_err(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned()
    };
    for round in 0..2 {
        let id = if rank == 0 {
            let mut id = NcclUniqueId { internal: [0; 128] };
            // SAFETY: a valid out-pointer.
            let rc = unsafe { get_id(&mut id) };
            if rc != 0 {
                return Err(format!("ncclGetUniqueId: {rc}: {}", last()));
            }
            publish(&dir.join(round.to_string()), &id.internal)?;
            id
        } else {
            read_id(&dir.join(round.to_string()))?
        };
        let mut c: Comm = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the id comes from rank 0.
        let rc = unsafe { init(&mut c, n as c_int, id, rank as c_int) };
        if !expect_ok {
            // The refusal is what the case checks: print it, as a user would see it.
            println!("init returned {rc}: {}", last());
            return Ok(());
        }
        if rc != 0 {
            return Err(format!("ncclCommInitRank: {rc}: {}", last()));
        }
        if round == 0 {
            const COUNT: usize = 256;
            let mut buf: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            let rc = unsafe { mem_alloc(&mut buf, COUNT * 4) };
            if rc != 0 {
                return Err(format!("ncclMemAlloc: {rc}: {}", last()));
            }
            // SAFETY: `buf` holds COUNT floats (host-backend device memory is host memory).
            unsafe { std::slice::from_raw_parts_mut(buf.cast::<f32>(), COUNT) }.fill(1.0);
            // SAFETY: in place, COUNT float32 elements, sum, NULL stream (host backend).
            let rc = unsafe { all_reduce(buf, buf, COUNT, 7, 0, c, std::ptr::null_mut()) };
            if rc != 0 {
                return Err(format!("ncclAllReduce: {rc}: {}", last()));
            }
            // SAFETY: as above, after the call returned (the host backend completes it).
            let got = unsafe { std::slice::from_raw_parts(buf.cast::<f32>(), COUNT) };
            if got.iter().any(|&v| v != n as f32) {
                return Err(format!("all-reduce gave {} instead of {n}", got[0]));
            }
            // SAFETY: allocated above, freed once.
            unsafe { mem_free(buf) };
            let mut k = 0;
            // SAFETY: a NULL handle is refused with ncclInvalidArgument: the warning checked.
            let rc = unsafe { count_f(std::ptr::null_mut(), &mut k) };
            if rc == 0 {
                return Err("ncclCommCount(NULL) succeeded".into());
            }
        }
        // SAFETY: a live handle, destroyed once.
        let rc = unsafe { destroy(c) };
        if rc != 0 {
            return Err(format!("ncclCommDestroy: {rc}: {}", last()));
        }
    }
    Ok(())
}

/// Runs `n` ranks with `env` and returns each rank's output (stdout then stderr).
fn run(n: usize, tag: &str, env: &[(&str, &str)], expect_ok: bool) -> Result<Vec<Output>, Failed> {
    lib_path()?;
    let dir = fresh_dir(&format!("debug-{tag}"))?;
    for round in 0..2 {
        std::fs::create_dir_all(dir.join(round.to_string())).map_err(|e| e.to_string())?;
    }
    let mut children = Vec::new();
    for rank in 0..n {
        let mut cmd = rank_command(ROLE, DIR_VAR, rank, &dir)?;
        for v in CLEARED {
            cmd.env_remove(v);
        }
        cmd.env(NRANKS_VAR, n.to_string())
            .env(EXPECT_VAR, if expect_ok { "ok" } else { "fail" });
        for (k, v) in env {
            cmd.env(k, v);
        }
        children.push(
            cmd.spawn()
                .map_err(|e| format!("spawning rank {rank}: {e}"))?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut outs = Vec::new();
    let mut failures = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let (out, killed) = wait_or_kill(child, deadline, Duration::from_millis(20))?;
        if killed || !out.status.success() {
            failures.push(rank_failure(rank, &out));
        }
        outs.push(out);
    }
    let _ = std::fs::remove_dir_all(&dir);
    if failures.is_empty() {
        Ok(outs)
    } else {
        Err(failures.join("\n").into())
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn check(cond: bool, what: &str, text: &str) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(format!("{what}; the rank printed:\n{text}").into())
    }
}

/// `host:pid:tid [dev] NCCL INFO ...`: NCCL's layout, with this process's pid.
fn is_nccl_line(line: &str, pid: u32, tag: &str) -> bool {
    let Some((head, rest)) = line.split_once(' ') else {
        return false;
    };
    let parts: Vec<&str> = head.split(':').collect();
    parts.len() == 3
        && !parts[0].is_empty()
        && parts[1] == pid.to_string()
        && parts[2].parse::<u32>().is_ok()
        && rest.starts_with('[')
        && rest.contains(&format!("NCCL {tag} "))
}

fn levels_info() -> Result<(), Failed> {
    let outs = run(2, "info", &[("NCCL_DEBUG", "INFO")], true)?;
    for (rank, o) in outs.iter().enumerate() {
        let text = stdout(o);
        let pid = o
            .stdout
            .split(|&b| b == b'\n')
            .filter_map(|l| std::str::from_utf8(l).ok())
            .find_map(|l| l.split(':').nth(1)?.parse::<u32>().ok())
            .unwrap_or(0);
        let info: Vec<&str> = text
            .lines()
            .filter(|l| is_nccl_line(l, pid, "INFO"))
            .collect();
        check(
            !info.is_empty(),
            "no NCCL INFO line in NCCL's layout",
            &text,
        )?;
        let banners = text.matches("NCCL version 2.").count();
        check(
            banners == 1,
            "the version banner not printed exactly once",
            &text,
        )?;
        check(
            text.contains(&format!("rank {rank} nranks 2 cudaDev ")),
            "no line with this rank, the rank count and the device",
            &text,
        )?;
        check(
            text.contains("Init COMPLETE: served natively by mscclpp-rs"),
            "no line saying which library serves the communicator",
            &text,
        )?;
        check(
            text.contains("AllReduce algorithm by rank-block size"),
            "no line with the algorithm choices",
            &text,
        )?;
        check(
            text.contains("NCCL WARN") && text.contains("ncclCommCount: comm is NULL"),
            "no warning for the failing call",
            &text,
        )?;
        // Subsystems default to INIT,BOOTSTRAP,ENV: no per-collective line.
        check(
            !text.contains("AllReduce: sendbuff"),
            "a COLL line without NCCL_DEBUG_SUBSYS asking for it",
            &text,
        )?;
    }
    eprintln!("rank 0 with NCCL_DEBUG=INFO:\n{}", stdout(&outs[0]));
    Ok(())
}

fn levels_version() -> Result<(), Failed> {
    let outs = run(1, "version", &[("NCCL_DEBUG", "version")], true)?;
    let text = stdout(&outs[0]);
    check(
        text.lines()
            .filter(|l| l.starts_with("NCCL version 2."))
            .count()
            == 1,
        "not exactly one bare version line",
        &text,
    )?;
    check(
        !text.contains("NCCL INFO") && !text.contains("NCCL WARN"),
        "INFO or WARN lines at VERSION",
        &text,
    )
}

fn levels_warn() -> Result<(), Failed> {
    let outs = run(1, "warn", &[("NCCL_DEBUG", "WARN")], true)?;
    let text = stdout(&outs[0]);
    let warn = text
        .lines()
        .find(|l| l.contains("NCCL WARN"))
        .unwrap_or_default();
    check(
        is_nccl_line(warn, outs_pid(warn), "WARN") && warn.contains("ncclCommCount: comm is NULL"),
        "no warning in NCCL's layout for the failing call",
        &text,
    )?;
    check(
        text.lines()
            .filter(|l| l.starts_with("NCCL version 2."))
            .count()
            == 1,
        "no version banner at WARN",
        &text,
    )?;
    check(!text.contains("NCCL INFO"), "INFO lines at WARN", &text)
}

/// The pid field of a line (the tests check its shape, not which pid).
fn outs_pid(line: &str) -> u32 {
    line.split(':')
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

fn subsystems() -> Result<(), Failed> {
    // COLL only: the per-collective line, no init line (the banner is printed whatever the
    // subsystems).
    let outs = run(
        1,
        "coll",
        &[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "coll")],
        true,
    )?;
    let text = stdout(&outs[0]);
    check(
        text.contains("NCCL INFO AllReduce: sendbuff") && text.contains("count 256 datatype 7"),
        "no COLL line for the all-reduce",
        &text,
    )?;
    check(
        !text.contains("Init COMPLETE"),
        "an INIT line under COLL",
        &text,
    )?;
    check(text.contains("NCCL version"), "no banner under COLL", &text)?;
    // Negation: everything but INIT.
    let outs = run(
        1,
        "notinit",
        &[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "^INIT")],
        true,
    )?;
    let text = stdout(&outs[0]);
    check(
        text.contains("AllReduce: sendbuff") && !text.contains("Init COMPLETE"),
        "^INIT did not keep COLL and drop INIT",
        &text,
    )?;
    // ALL: both.
    let outs = run(
        1,
        "all",
        &[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "ALL")],
        true,
    )?;
    let text = stdout(&outs[0]);
    check(
        text.contains("AllReduce: sendbuff") && text.contains("Init COMPLETE"),
        "ALL did not print both INIT and COLL lines",
        &text,
    )?;
    // TRACE with CALL: one line per API call.
    let outs = run(
        1,
        "call",
        &[("NCCL_DEBUG", "TRACE"), ("NCCL_DEBUG_SUBSYS", "CALL")],
        true,
    )?;
    let text = stdout(&outs[0]);
    check(
        text.contains("NCCL TRACE ncclAllReduce") && !text.contains("Init COMPLETE"),
        "no CALL trace of ncclAllReduce at TRACE (or INIT lines under CALL)",
        &text,
    )
}

fn file_pattern() -> Result<(), Failed> {
    let dir = fresh_dir("debug-logs")?;
    let pattern = dir.join("nccl.%h.%p.log");
    let outs = run(
        1,
        "file",
        &[
            ("NCCL_DEBUG", "INFO"),
            (
                "NCCL_DEBUG_FILE",
                pattern.to_str().ok_or("non-UTF-8 temp dir")?,
            ),
        ],
        true,
    )?;
    let text = stdout(&outs[0]);
    check(
        !text.contains("NCCL INFO"),
        "INFO lines on stdout with a file",
        &text,
    )?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(|e| e.to_string())?;
    let host = host.trim().split('.').next().unwrap_or_default().to_owned();
    let files: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let name = files
        .iter()
        .find(|f| f.starts_with(&format!("nccl.{host}.")) && f.ends_with(".log"))
        .ok_or_else(|| format!("no nccl.{host}.<pid>.log in {}: {files:?}", dir.display()))?;
    let pid: u32 = name
        .trim_start_matches(&format!("nccl.{host}."))
        .trim_end_matches(".log")
        .parse()
        .map_err(|_| format!("{name}: %p did not become a pid"))?;
    let logged = std::fs::read_to_string(dir.join(name)).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    check(
        logged.lines().any(|l| is_nccl_line(l, pid, "INFO")) && logged.contains("Init COMPLETE"),
        "the file lacks the INFO lines of that pid",
        &logged,
    )
}

fn mscclpp_level_wins() -> Result<(), Failed> {
    let outs = run(
        1,
        "precedence",
        &[("NCCL_DEBUG", "INFO"), ("MSCCLPP_LOG_LEVEL", "error")],
        true,
    )?;
    let text = output_text(&outs[0]);
    check(
        !text.contains("NCCL INFO") && !text.contains("NCCL version"),
        "NCCL_DEBUG applied although MSCCLPP_LOG_LEVEL is set",
        &text,
    )
}

/// A 1-rank communicator refuses what a 2-rank one refuses, and each refusal names the
/// variable.
fn bad_values_refused_at_init() -> Result<(), Failed> {
    for (var, value, want) in [
        ("MSCCLPP_ALGO_ALLREDUCE", "bogus", "MSCCLPP_ALGO_ALLREDUCE"),
        ("MSCCLPP_LL_THREADS", "0", "32 to 1024"),
        (
            "MSCCLPP_LL_PACKETS_PER_BLOCK",
            "0",
            "MSCCLPP_LL_PACKETS_PER_BLOCK=0",
        ),
        (
            "MSCCLPP_DIRECT_THREADS",
            "100000",
            "MSCCLPP_DIRECT_THREADS=100000",
        ),
        (
            "MSCCLPP_BOOTSTRAP_TIMEOUT",
            "0.000001",
            "MSCCLPP_BOOTSTRAP_TIMEOUT",
        ),
    ] {
        for n in [1, 2] {
            let outs = run(n, &format!("bad-{n}"), &[(var, value)], false)?;
            for o in &outs {
                let text = stdout(o);
                check(
                    text.contains("init returned") && !text.contains("init returned 0:"),
                    &format!("{var}={value} accepted by a {n}-rank communicator"),
                    &text,
                )?;
                check(
                    text.contains(want),
                    &format!("{var}={value}: the refusal does not say {want:?}"),
                    &text,
                )?;
            }
        }
    }
    Ok(())
}

fn main() {
    run_if_rank(ROLE, DIR_VAR, rank_main);
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![
        Trial::test("debug::host::nccl_debug_info_2_ranks", levels_info),
        Trial::test("debug::host::nccl_debug_version", levels_version),
        Trial::test("debug::host::nccl_debug_warn", levels_warn),
        Trial::test("debug::host::nccl_debug_subsys", subsystems),
        Trial::test("debug::host::nccl_debug_file_pattern", file_pattern),
        Trial::test(
            "debug::host::mscclpp_log_level_takes_precedence",
            mscclpp_level_wins,
        ),
        Trial::test(
            "env::host::bad_values_refused_at_init_1_and_2_ranks",
            bad_values_refused_at_init,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
