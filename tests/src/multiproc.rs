//! Multi-process tests: a test binary re-executes itself (`std::env::current_exe()`) with a role
//! in the environment, so the same binary works wherever it is copied (the GPU machine too).
//!
//! The parent calls [`spawn`] / [`spawn_ranks`]; each child's `main` calls [`role`] first and,
//! if it has one, runs it and exits. Children report with [`report`] lines on standard output,
//! which the parent reads back from [`ChildOutcome::reports`].

use std::collections::HashMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::comm::Communicator;
use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot, UniqueId};
use mscclpp::hal::{BackendKind, Device};

/// Variable carrying the role name.
pub const ROLE_VAR: &str = "MSCCLPP_TEST_ROLE";
/// Variable carrying a child's rank.
pub const RANK_VAR: &str = "MSCCLPP_TEST_RANK";
/// Variable carrying the number of children.
pub const NRANKS_VAR: &str = "MSCCLPP_TEST_NRANKS";
const REPORT_PREFIX: &str = "MSCCLPP-REPORT ";

/// The role this process was started in, if it is a child.
pub fn role() -> Option<String> {
    std::env::var(ROLE_VAR).ok().filter(|r| !r.is_empty())
}

/// The start of every multi-process test binary's `main`: in a child, runs `run` with its role
/// and exits (status 1 with the error on standard error, naming the rank; else 0). Returns in
/// the parent.
pub fn run_child(run: impl FnOnce(&str) -> Result<(), String>) {
    if let Some(role) = role() {
        if let Err(e) = run(&role) {
            eprintln!("rank {}: {e}", rank_and_size().0);
            std::process::exit(1);
        }
        std::process::exit(0);
    }
}

/// This child's rank and the number of ranks.
pub fn rank_and_size() -> (usize, usize) {
    let get = |v: &str| {
        std::env::var(v)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    (get(RANK_VAR), get(NRANKS_VAR))
}

/// A rank's communicator, its device and its backend ([`rank_communicator`]).
pub type RankComm = (Arc<Communicator>, Arc<dyn Device>, BackendKind);

/// This child's communicator, its device and backend: the bootstrap joins the unique id in the
/// environment variable `uid_var`; the device is of the backend named in `backend_var` (the host
/// backend: one per rank; GPUs: `rank % count`, or device 0 for every rank with `share`).
pub fn rank_communicator(
    uid_var: &str,
    backend_var: &str,
    share: bool,
) -> Result<RankComm, String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let (rank, n) = rank_and_size();
    let uid: UniqueId = std::env::var(uid_var)
        .map_err(|x| format!("{uid_var}: {x}"))?
        .parse()
        .map_err(|x| e(&x))?;
    let cfg = BootstrapConfig::from_env().map_err(|x| e(&x))?;
    let boot = Arc::new(Bootstrap::new(&uid, rank, n, cfg).map_err(|x| e(&x))?);
    let kind: BackendKind = std::env::var(backend_var)
        .map_err(|x| format!("{backend_var}: {x}"))?
        .parse()
        .map_err(|x| e(&x))?;
    let backend = mscclpp::registry::probe(kind).map_err(|x| e(&x))?;
    // The host backend's devices are per host (8): a rank takes its place among its host's ranks
    // (simulated hosts, `MSCCLPP_HOSTID`, may hold 16 ranks in all).
    let hosts = boot.hosts();
    let local = hosts[..rank].iter().filter(|&&h| h == hosts[rank]).count();
    let ordinal = match kind {
        BackendKind::Host => local,
        _ if share => 0,
        _ => rank % backend.device_count().max(1),
    };
    let device = backend.open_device(ordinal).map_err(|x| e(&x))?;
    Ok((
        Arc::new(Communicator::new(boot, device.clone())),
        device,
        kind,
    ))
}

/// Prints a `key=value` report line for the parent.
pub fn report(key: &str, value: impl std::fmt::Display) {
    println!("{REPORT_PREFIX}{key}={value}");
}

/// How one child ended.
#[derive(Debug)]
pub struct ChildOutcome {
    /// Its rank.
    pub rank: usize,
    /// Exit code (`None`: killed by a signal, or by us at the deadline).
    pub code: Option<i32>,
    /// Whether we killed it because the deadline passed.
    pub timed_out: bool,
    /// Everything it printed on standard output.
    pub stdout: String,
    /// Everything it printed on standard error.
    pub stderr: String,
    /// When it ended, measured from the spawn.
    pub elapsed: Duration,
}

impl ChildOutcome {
    /// The `key=value` reports it printed (last one wins per key).
    pub fn reports(&self) -> HashMap<String, String> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix(REPORT_PREFIX))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// Whether it exited with status 0.
    pub fn ok(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }

    /// A one-paragraph description for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "rank {} exit {:?}{} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.rank,
            self.code,
            if self.timed_out {
                " (killed at deadline)"
            } else {
                ""
            },
            self.elapsed,
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

/// A running child.
#[derive(Debug)]
pub struct Running {
    rank: usize,
    child: Child,
    started: Instant,
}

impl Running {
    /// Kills the child now (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Starts one child of this binary in `role`, with `rank`/`nranks` and extra variables.
pub fn spawn(role: &str, rank: usize, nranks: usize, env: &[(String, String)]) -> Running {
    spawn_via(&[], role, rank, nranks, env)
}

/// [`spawn`] through a launcher command `via` (e.g. `ip netns exec NAME`, which runs the child
/// in a network namespace); empty: the binary itself.
pub fn spawn_via(
    via: &[&str],
    role: &str,
    rank: usize,
    nranks: usize,
    env: &[(String, String)],
) -> Running {
    let exe = std::env::current_exe().expect("current_exe of the test binary");
    let mut cmd = match via.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.env(ROLE_VAR, role)
        .env(RANK_VAR, rank.to_string())
        .env(NRANKS_VAR, nranks.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawning a test child");
    Running {
        rank,
        child,
        started: Instant::now(),
    }
}

/// Waits for a child until `deadline`, killing it if it is still running then.
pub fn wait(mut r: Running, deadline: Instant) -> ChildOutcome {
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = r.child.stdout.take();
    let mut err = r.child.stderr.take();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let mut timed_out = false;
    let (code, elapsed) = loop {
        match r.child.try_wait() {
            Ok(Some(status)) => break (status.code(), r.started.elapsed()),
            Ok(None) if Instant::now() >= deadline => {
                timed_out = true;
                let _ = r.child.kill();
                let status = r.child.wait().ok();
                break (status.and_then(|s| s.code()), r.started.elapsed());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break (None, r.started.elapsed()),
        }
    };
    ChildOutcome {
        rank: r.rank,
        code,
        timed_out,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
        elapsed,
    }
}

/// Every child that failed, described (one per line), or `Ok` when all succeeded.
pub fn all_ok(outs: &[ChildOutcome]) -> Result<(), String> {
    let failed: Vec<String> = outs
        .iter()
        .filter(|o| !o.ok())
        .map(|o| o.describe())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("\n"))
    }
}

/// The parent's side of [`rank_communicator`]: starts a bootstrap root on the loopback for `n`
/// ranks, then `n` children in `role` with its unique id in `uid_var` (and `env`), and waits for
/// them (at most `timeout`); an error describes every child that failed.
pub fn spawn_with_root(
    role: &str,
    n: usize,
    uid_var: &str,
    env: &[(String, String)],
    timeout: Duration,
) -> Result<Vec<ChildOutcome>, String> {
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(60),
        ..BootstrapConfig::default()
    };
    let loopback = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0));
    let (_root, uid) = BootstrapRoot::start(loopback, n, &cfg).map_err(|x| x.to_string())?;
    let mut all = vec![
        (uid_var.to_string(), uid.to_string()),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT".to_string(), "120".to_string()),
    ];
    all.extend_from_slice(env);
    let outs = spawn_ranks(role, n, &all, timeout);
    all_ok(&outs)?;
    Ok(outs)
}

/// Starts `n` ranks of this binary in `role` and waits for all of them (at most `timeout`).
pub fn spawn_ranks(
    role: &str,
    n: usize,
    env: &[(String, String)],
    timeout: Duration,
) -> Vec<ChildOutcome> {
    let children: Vec<_> = (0..n).map(|r| spawn(role, r, n, env)).collect();
    let deadline = Instant::now() + timeout;
    children.into_iter().map(|c| wait(c, deadline)).collect()
}
