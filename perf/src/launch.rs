//! How ranks come to be, for programs built on the library (the benchmark tool, the examples):
//! from a launcher's environment (mpirun, torchrun, srun), or spawned by the program itself, one
//! process per rank, when it is run standalone.
//!
//! ```no_run
//! use mscclpp_perf::launch::{self, Role};
//! let role = launch::role()?;
//! if let Role::Parent = role {
//!     // Standalone: start 2 copies of this program as ranks 0 and 1 and wait for them.
//!     std::process::exit(if launch::spawn_and_wait(2)? == 0 { 0 } else { 1 });
//! }
//! let boot = launch::bootstrap(&role)?; // a rank: join the others
//! # Ok::<(), mscclpp::Error>(())
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot, UniqueId};
use mscclpp::hal::{Error, Result};

const UID_VAR: &str = "MSCCLPP_PERF_UID";
const RANK_VAR: &str = "MSCCLPP_PERF_RANK";
const NRANKS_VAR: &str = "MSCCLPP_PERF_NRANKS";

/// Where this process stands.
#[derive(Debug)]
pub enum Role {
    /// A rank spawned by a standalone parent.
    Child {
        uid: UniqueId,
        rank: usize,
        nranks: usize,
    },
    /// A rank started by mpirun/torchrun/srun.
    Launched,
    /// The standalone parent, which spawns the ranks.
    Parent,
}

/// Whether a launcher started this process as one of several ranks. A launcher variable that
/// is present but malformed is an error: falling back to a standalone run would make every
/// process of a launched job run a job of its own and report success.
fn launched_with_several_ranks() -> Result<bool> {
    let lookup = |k: &str| mscclpp::hal::env::get(k);
    let info = mscclpp::comm::bootstrap::detect_launch_optional(&lookup)?;
    Ok(info.is_some_and(|i| i.world_size > 1))
}

fn program_name() -> String {
    std::env::args()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "mscclpp".into())
}

/// Decides the role from the environment.
pub fn role() -> Result<Role> {
    if let Some(uid) = mscclpp::hal::env::get(UID_VAR) {
        let uid: UniqueId = uid.parse()?;
        let rank = mscclpp::hal::env::parse::<usize>(RANK_VAR, "a rank")?
            .ok_or_else(|| Error::invalid(format!("{UID_VAR} is set but {RANK_VAR} is not")))?;
        let nranks = mscclpp::hal::env::parse::<usize>(NRANKS_VAR, "a rank count")?
            .ok_or_else(|| Error::invalid(format!("{UID_VAR} is set but {NRANKS_VAR} is not")))?;
        return Ok(Role::Child { uid, rank, nranks });
    }
    if launched_with_several_ranks()? {
        return Ok(Role::Launched);
    }
    // Checked here too (the parent's root listens on loopback and would never look at it).
    mscclpp::comm::bootstrap::BootstrapConfig::from_env()?;
    Ok(Role::Parent)
}

/// Joins the bootstrap for a rank role.
pub fn bootstrap(role: &Role) -> Result<Bootstrap> {
    let cfg = BootstrapConfig::from_env()?;
    match role {
        Role::Child { uid, rank, nranks } => Bootstrap::new(uid, *rank, *nranks, cfg),
        Role::Launched => Bootstrap::from_env(cfg),
        Role::Parent => Err(Error::Internal("the parent is not a rank".into())),
    }
}

/// Spawns `nranks` copies of this program as ranks and waits for them. Rank 0's standard
/// output is passed through (rows appear as they are measured); every rank's standard error is.
/// Returns the number of ranks that failed.
pub fn spawn_and_wait(nranks: usize) -> Result<usize> {
    spawn_hosts_and_wait(nranks, 1)
}

/// [`spawn_and_wait`] with the ranks split into `hosts` simulated hosts: each group of
/// `nranks / hosts` consecutive ranks gets its own `MSCCLPP_HOSTID`.
pub fn spawn_hosts_and_wait(nranks: usize, hosts: usize) -> Result<usize> {
    if hosts == 0 || nranks % hosts != 0 {
        return Err(Error::invalid(format!(
            "--hosts {hosts}: {nranks} ranks do not split into {hosts} hosts of equal size"
        )));
    }
    let per_host = nranks / hosts;
    let cfg = BootstrapConfig::from_env()?;
    let (root, uid) =
        BootstrapRoot::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), nranks, &cfg)?;
    let exe = std::env::current_exe().map_err(|e| Error::io("locating this program", e))?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(nranks);
    for rank in 0..nranks {
        let mut cmd = Command::new(&exe);
        if hosts > 1 {
            cmd.env(
                "MSCCLPP_HOSTID",
                format!(
                    "{}-{}-host-{}",
                    program_name(),
                    std::process::id(),
                    rank / per_host
                ),
            );
        }
        let child = cmd
            .args(&args)
            .env(UID_VAR, uid.to_string())
            .env(RANK_VAR, rank.to_string())
            .env(NRANKS_VAR, nranks.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .stdin(Stdio::null())
            .stdout(if rank == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| Error::io(format!("spawning rank {rank}"), e))?;
        children.push((rank, child));
    }
    // Ranks detect each other's failures through the bootstrap; if one fails and another does
    // not follow within the grace period, it is stopped here so that nothing hangs.
    let grace = cfg.timeout + Duration::from_secs(10);
    let mut failed = 0;
    let mut first_failure: Option<Instant> = None;
    let mut running: Vec<(usize, Child)> = children;
    while !running.is_empty() {
        let mut still = Vec::with_capacity(running.len());
        for (rank, mut child) in running {
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        eprintln!("{}: rank {rank} failed ({status})", program_name());
                        failed += 1;
                        first_failure.get_or_insert_with(Instant::now);
                    }
                }
                Ok(None) => still.push((rank, child)),
                Err(e) => return Err(Error::io(format!("waiting for rank {rank}"), e)),
            }
        }
        running = still;
        if let Some(t) = first_failure {
            if t.elapsed() > grace {
                for (rank, child) in &mut running {
                    eprintln!(
                        "mscclpp-perf: stopping rank {rank}, still running {grace:?} after a failure"
                    );
                    let _ = child.kill();
                    let _ = child.wait();
                    failed += 1;
                }
                running.clear();
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(root);
    Ok(failed)
}
