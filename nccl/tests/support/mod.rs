//! What the C-ABI tests of `libmscclpp_nccl.so` share: finding and `dlopen`ing the library, the
//! symbol lookup, and running this test binary again as child processes (the ranks) with a
//! deadline. Each test binary uses a different part of it.
#![allow(dead_code)]

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mscclpp_nccl::abi::NcclUniqueId;

/// Keeps the library's echo of each refused call (`mscclpp_nccl::error` at WARN) out of this
/// test binary's output: the tests provoke those refusals on purpose and check each one's code
/// and `ncclGetLastError`, so the echo read as an alarm in a passing run. Any other warning still
/// shows, and a logging variable set by hand (`RUST_LOG`, `MSCCLPP_LOG_LEVEL`, `NCCL_DEBUG`)
/// wins. Call it first in `main`.
pub fn quiet_expected_refusals() {
    let by_hand = [
        "RUST_LOG",
        "MSCCLPP_LOG_LEVEL",
        "MSCCLPP_DEBUG",
        "NCCL_DEBUG",
    ]
    .iter()
    .any(|k| std::env::var_os(k).is_some());
    if !by_hand {
        // SAFETY: first in `main`, before this process has a second thread.
        unsafe { std::env::set_var("RUST_LOG", "warn,mscclpp_nccl::error=off") };
    }
}

/// A backend's probe error as an ignored trial's reason: without the parenthesised list of the
/// library files it tried (`(tried …)`), which made the line 260 characters long.
pub fn ignore_reason(error: impl std::fmt::Display) -> String {
    let e = error.to_string();
    match e
        .find(" (tried ")
        .and_then(|s| Some((s, e[s..].find(')')?)))
    {
        Some((start, len)) => format!("{}{}", &e[..start], &e[start + len + 1..]),
        None => e,
    }
}

/// An `ncclComm_t`.
pub type Comm = *mut c_void;

/// `ncclAllReduce`, `ncclReduceScatter`, `ncclBroadcast`, `ncclReduce` without its root:
/// (send, recv, count, datatype, op or root, comm, stream).
pub type CollFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    *mut c_void,
) -> c_int;
/// `ncclAllGather`, `ncclAlltoAll`: (send, recv, count, datatype, comm, stream).
pub type MoveFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, *mut c_void) -> c_int;

/// The cdylib cargo builds with this package's tests: next to the test binary (`deps/`) or one
/// directory up.
pub fn lib_path() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let deps = exe
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", exe.display()))?;
    [Some(deps), deps.parent()]
        .into_iter()
        .flatten()
        .map(|d| d.join("libmscclpp_nccl.so"))
        .find(|p| p.exists())
        .ok_or_else(|| {
            format!(
                "libmscclpp_nccl.so not found in {} or its parent: cargo builds the cdylib with this package's tests",
                deps.display()
            )
        })
}

/// `dlopen`s the library, as a C program would.
pub fn open_lib() -> Result<libloading::Library, String> {
    let p = lib_path()?;
    // SAFETY: our own library; its initialisers are Rust statics only.
    unsafe { libloading::Library::new(&p) }.map_err(|e| format!("dlopen {}: {e}", p.display()))
}

/// An export of `$lib` as the C function type given (or as one of the aliases below), or an early
/// `Err` naming the missing export.
macro_rules! sym {
    ($lib:expr, $name:literal as $t:ty) => {{
        // SAFETY: the alias is the export's C signature (NCCL 2.28 nccl.h).
        *unsafe { $lib.get::<$t>(concat!($name, "\0").as_bytes()) }
            .map_err(|e| format!("{}: {e}", $name))?
    }};
    ($lib:expr, $name:literal, fn($($a:ty),*) -> $r:ty) => {{
        // SAFETY: the type is the export's C signature (NCCL 2.28 nccl.h).
        *unsafe { $lib.get::<unsafe extern "C" fn($($a),*) -> $r>(concat!($name, "\0").as_bytes()) }
            .map_err(|e| format!("{}: {e}", $name))?
    }};
}

/// This test binary again, output captured, without a real NCCL to forward to.
pub fn self_command() -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.env_remove("MSCCLPP_NCCL_LIB_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Ok(cmd)
}

/// Rank `rank` of a host-backend test: this binary with `role_var` set to the rank and `dir_var`
/// to the directory the ranks share, served natively (no fallback operation forced).
pub fn rank_command(
    role_var: &str,
    dir_var: &str,
    rank: usize,
    dir: &Path,
) -> Result<Command, String> {
    let mut cmd = self_command()?;
    cmd.env(role_var, rank.to_string())
        .env(dir_var, dir)
        .env("MSCCLPP_BACKEND", "host")
        .env("MSCCLPP_BOOTSTRAP_TIMEOUT", "30")
        .env_remove("MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION");
    Ok(cmd)
}

/// In a child started by [`rank_command`] (`role_var` set): runs `rank_main` and exits with its
/// result. Returns in the test runner.
pub fn run_if_rank(
    role_var: &str,
    dir_var: &str,
    rank_main: impl FnOnce(usize, &Path) -> Result<(), String>,
) {
    if let Ok(rank) = std::env::var(role_var) {
        let dir = PathBuf::from(std::env::var(dir_var).unwrap_or_default());
        let rank: usize = rank.parse().unwrap_or(usize::MAX);
        match rank_main(rank, &dir) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("rank {rank} failed: {e}");
                std::process::exit(1);
            }
        }
    }
}

/// An empty directory of this test run (`mscclpp-nccl-<tag>-<pid>` in the temp directory).
pub fn fresh_dir(tag: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("mscclpp-nccl-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// The rank a command made by [`rank_command`] runs (its `role_var`), for a `run_ranks`
/// preparation that sets something per rank (a host id, a service address).
#[allow(dead_code)]
pub fn rank_of(cmd: &Command, role_var: &str) -> Option<usize> {
    cmd.get_envs()
        .find(|(k, _)| *k == role_var)
        .and_then(|(_, v)| v?.to_str()?.parse().ok())
}

/// A TCP port free on the loopback now (for a service a test's ranks start).
#[allow(dead_code)]
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

/// Waits for `child` until `deadline`, polling every `poll`, and kills it if it is still running
/// then; its output, and whether it had to be killed (a hang).
pub fn wait_or_kill(
    mut child: Child,
    deadline: Instant,
    poll: Duration,
) -> Result<(Output, bool), String> {
    let mut killed = false;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(poll),
            _ => {
                let _ = child.kill();
                killed = true;
                break;
            }
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    Ok((out, killed))
}

/// A child's stdout then stderr.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A failed rank as the tests report it: its exit status and everything it printed.
pub fn rank_failure(rank: usize, out: &Output) -> String {
    format!("rank {rank}: {}\n{}", out.status, output_text(out))
}

/// Rank 0's side of the unique-id exchange through `dir`: `bytes` written whole, then renamed to
/// `dir/id`, so that no rank reads a part.
pub fn publish(dir: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = dir.join("id.tmp");
    std::fs::write(&tmp, bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join("id")).map_err(|e| format!("{}: {e}", tmp.display()))
}

/// The other ranks' side: the `len` bytes rank 0 published, waited for up to 60 s.
pub fn wait_published(dir: &Path, len: usize) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(b) = std::fs::read(dir.join("id"))
            && b.len() == len
        {
            return Ok(b);
        }
        if Instant::now() > deadline {
            return Err("rank 0 never wrote the unique id".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The unique id rank 0 published alone.
pub fn read_id(dir: &Path) -> Result<NcclUniqueId, String> {
    let b = wait_published(dir, 128)?;
    let mut id = NcclUniqueId { internal: [0; 128] };
    id.internal.copy_from_slice(&b);
    Ok(id)
}

/// Another process's marker file `p`, waited for up to 60 s.
pub fn wait_file(p: &Path) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(b) = std::fs::read(p) {
            return Ok(b);
        }
        if Instant::now() > deadline {
            return Err(format!("{} never appeared", p.display()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Writes `data` to `p` whole (through a temporary file and a rename), so no reader sees a part.
pub fn mark(p: &Path, data: &[u8]) -> Result<(), String> {
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, data).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, p).map_err(|e| e.to_string())
}

/// Runs `nranks` ranks of this test binary (children started by [`rank_command`], each given
/// `prepare` first) and waits up to `timeout`; each must exit 0 having written `dir/done-<rank>`.
/// The failures of every rank, joined, as the error.
pub fn run_ranks(
    (role_var, dir_var): (&str, &str),
    dir: &Path,
    nranks: usize,
    timeout: Duration,
    prepare: impl Fn(&mut Command),
) -> Result<(), String> {
    let mut children = Vec::new();
    for rank in 0..nranks {
        let mut cmd = rank_command(role_var, dir_var, rank, dir)?;
        prepare(&mut cmd);
        children.push(
            cmd.spawn()
                .map_err(|e| format!("spawning rank {rank}: {e}"))?,
        );
    }
    let deadline = Instant::now() + timeout;
    let mut failures = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let (out, killed) = wait_or_kill(child, deadline, Duration::from_millis(20))
            .map_err(|e| format!("rank {rank} output: {e}"))?;
        if killed {
            failures.push(format!(
                "rank {rank}: no result within {} s (killed)",
                timeout.as_secs()
            ));
        }
        if !out.status.success() {
            failures.push(rank_failure(rank, &out));
        } else if !dir.join(format!("done-{rank}")).exists() {
            failures.push(format!("rank {rank} exited 0 without finishing its checks"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// Rank `rank` of `nranks` joins a communicator through the C ABI as a C program does: rank 0
/// makes the id (`ncclGetUniqueId`) and publishes it in `dir`, the others read it; then
/// `ncclCommInitRankConfig` with `config` (NULL: the defaults).
pub fn init_world(
    lib: &libloading::Library,
    rank: usize,
    nranks: usize,
    dir: &Path,
    config: *mut mscclpp_nccl::abi::NcclConfig,
) -> Result<Comm, String> {
    let get_id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
    let init = sym!(
        lib,
        "ncclCommInitRankConfig",
        fn(*mut Comm, c_int, NcclUniqueId, c_int, *mut mscclpp_nccl::abi::NcclConfig) -> c_int
    );
    let id = if rank == 0 {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer.
        if unsafe { get_id(&mut id) } != 0 {
            return Err("ncclGetUniqueId failed".into());
        }
        publish(dir, &id.internal)?;
        id
    } else {
        read_id(dir)?
    };
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: valid out-pointer; `config` is NULL or the caller's config.
    let rc = unsafe { init(&mut comm, nranks as c_int, id, rank as c_int, config) };
    if rc != 0 {
        return Err(format!("rank {rank}: ncclCommInitRankConfig returned {rc}"));
    }
    Ok(comm)
}
