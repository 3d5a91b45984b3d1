//! `mscclpp-perf`: the benchmark tool of mscclpp-rs.
//!
//! Standalone it spawns one process per rank (`--ranks`, default one per GPU, 2 on the host
//! backend); under mpirun, torchrun or srun each process is one rank. Rank 0 prints the table.

mod args;
mod bootstrap;
mod channels;
mod collective;
mod moe;
mod nccl;
mod overlap;
mod p2p;
mod plan;
mod plot;
mod report;

use std::process::ExitCode;

use std::sync::Arc;

use mscclpp::comm::Communicator;
use mscclpp::hal::{BackendKind, Result};
use mscclpp::transports::Transport;

use args::{Args, Bench};
use mscclpp_perf::launch::{self, Role};

/// The exit status of arguments that cannot run.
const USAGE: u8 = 2;

fn main() -> ExitCode {
    mscclpp::init_logging();
    let args = Args::parse_with_sources();
    if let Err(e) = args.validate() {
        eprintln!("mscclpp-perf: {e}");
        return ExitCode::from(USAGE);
    }
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mscclpp-perf: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<ExitCode> {
    if let Bench::Report {
        files,
        output,
        title,
    } = args.bench()
    {
        if let Err(e) = args.validate_for(0, BackendKind::Host) {
            eprintln!("mscclpp-perf: {e}");
            return Ok(ExitCode::from(USAGE));
        }
        let output = output.unwrap_or_else(|| plot::default_output(&files));
        plot::main(&files, &output, title.as_deref())?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Bench::Status { addr, token } = args.bench() {
        let report =
            mscclpp::comm::bootstrap::ask_status(addr, &token, std::time::Duration::from_secs(5))?;
        print!("{report}");
        return Ok(ExitCode::SUCCESS);
    }
    if let Bench::Bootstrap { reps } = args.bench() {
        if let Err(e) = args.validate_for(args.ranks.unwrap_or(2), BackendKind::Host) {
            eprintln!("mscclpp-perf: {e}");
            return Ok(ExitCode::from(USAGE));
        }
        return bootstrap::main(args.ranks, args.threads, reps);
    }
    let role = launch::role()?;
    if let Role::Parent = role {
        let backend = mscclpp::registry::select()?;
        let nranks = args.ranks.unwrap_or(match backend.kind() {
            BackendKind::Host => 2,
            _ => backend.device_count().max(2),
        });
        // What needs the rank count or the backend is checked here, once, before any rank
        // starts (each rank would print the same error).
        let checked = args
            .validate_for(nranks, backend.kind())
            .and_then(|()| args.check_memory(nranks, backend.kind(), args::available_memory()));
        if let Err(e) = checked {
            eprintln!("mscclpp-perf: {e}");
            return Ok(ExitCode::from(USAGE));
        }
        if backend.kind() == BackendKind::Host {
            // Comments go to stderr under -J - so that stdout stays pure JSON lines.
            let say = |line: String| {
                for l in report::wrap_comment(line.trim_start_matches("# ")) {
                    if args.json_lines() {
                        eprintln!("{l}");
                    } else {
                        println!("{l}");
                    }
                }
            };
            say("# no GPU backend available here: running on the host (CPU) backend".into());
            for o in mscclpp::registry::probe_all() {
                if let Err(e) = o.result {
                    say(format!("#   {}: {e}", o.kind));
                }
            }
        }
        if args.threads {
            if args.hosts.is_some_and(|h| h > 1) {
                return Err(mscclpp::Error::invalid(
                    "--hosts with --threads: simulated hosts need a process per rank (MSCCLPP_HOSTID is per process); drop --threads",
                ));
            }
            return rank_threads(args, nranks);
        }
        let failed = launch::spawn_hosts_and_wait(nranks, args.hosts.unwrap_or(1))?;
        return Ok(if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if args.threads {
        eprintln!(
            "mscclpp-perf: --threads runs every rank in this one process; under a launcher (mpirun, torchrun, srun) each process is a rank already: drop --threads or the launcher"
        );
        return Ok(ExitCode::from(USAGE));
    }
    let boot = Arc::new(launch::bootstrap(&role)?);
    rank(args, boot)
}

/// `--threads`: the ranks as threads of this process, each with its own bootstrap and
/// communicator on the device of its rank (on one GPU: one context for all).
fn rank_threads(args: &Args, nranks: usize) -> Result<ExitCode> {
    use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot};
    let cfg = BootstrapConfig::from_env()?;
    let (_root, uid) = BootstrapRoot::start(
        std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
        nranks,
        &cfg,
    )?;
    let results: Vec<Result<ExitCode>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..nranks)
            .map(|r| {
                let cfg = cfg.clone();
                std::thread::Builder::new()
                    .name(format!("rank {r}"))
                    .spawn_scoped(s, move || {
                        let boot = Arc::new(Bootstrap::new(&uid, r, nranks, cfg)?);
                        rank(args, boot)
                    })
            })
            .collect();
        hs.into_iter()
            .enumerate()
            .map(|(r, h)| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(mscclpp::Error::Internal(format!(
                        "rank {r}'s thread panicked"
                    )))
                }),
                Err(e) => Err(mscclpp::Error::io(format!("spawning rank {r}'s thread"), e)),
            })
            .collect()
    });
    let mut code = ExitCode::SUCCESS;
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Ok(c) if c == ExitCode::SUCCESS => {}
            Ok(c) => code = c,
            Err(e) => {
                eprintln!("mscclpp-perf: rank {r}: {e}");
                code = ExitCode::FAILURE;
            }
        }
    }
    Ok(code)
}

/// One rank's benchmark over `boot`: rank 0 prints the table.
fn rank(args: &Args, boot: Arc<mscclpp::comm::bootstrap::Bootstrap>) -> Result<ExitCode> {
    let backend = mscclpp::registry::select()?;
    // Ranks started by mpirun & co. have no parent that checked: rank 0 alone says why. The
    // memory check counts this rank alone (how many share the host is not known here).
    let checked = args
        .validate_for(boot.nranks(), backend.kind())
        .and_then(|()| args.check_memory(1, backend.kind(), args::available_memory()));
    if let Err(e) = checked {
        if boot.rank() == 0 {
            eprintln!("mscclpp-perf: {e}");
        }
        return Ok(ExitCode::from(USAGE));
    }
    let local = boot.local_rank().unwrap_or(boot.rank());
    let device = backend.open_device(local % backend.device_count().max(1))?;
    let bench = args.bench();
    let wrong = match &bench {
        Bench::P2p => p2p::run(args, &boot, device)?,
        Bench::MemoryChannel => {
            channels::run_memory_channel(args, &Communicator::new(boot.clone(), device))?
        }
        Bench::Plan { files } => plan::run(
            args,
            Arc::new(Communicator::new(boot.clone(), device)),
            files,
        )?,
        Bench::Moe {
            hidden,
            experts,
            topk,
            tokens,
        } => moe::run(
            args,
            Arc::new(Communicator::new(boot.clone(), device)),
            &moe::Shape {
                hidden: *hidden,
                experts: *experts,
                topk: *topk,
                tokens: args::moe_tokens(tokens).map_err(mscclpp::Error::invalid)?,
            },
        )?,
        Bench::Overlap {
            compute_us,
            collectives,
        } => {
            let kinds = args::overlap_kinds(collectives).map_err(mscclpp::Error::invalid)?;
            overlap::run(
                args,
                Arc::new(Communicator::new(boot.clone(), device)),
                *compute_us as f64,
                &kinds,
            )?
        }
        Bench::PortChannel { transport } => {
            let t: Transport = transport.parse()?;
            channels::run_port_channel(args, &Communicator::new(boot.clone(), device), t)?
        }
        collective => {
            let kind = collective.collective().ok_or_else(|| {
                mscclpp::Error::Internal(format!("{collective:?} is not a collective"))
            })?;
            collective::run(
                args,
                Arc::new(Communicator::new(boot.clone(), device)),
                kind,
            )?
        }
    };
    // The footer of rank 0's table says how many were wrong.
    Ok(if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
