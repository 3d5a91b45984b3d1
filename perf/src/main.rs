//! `mscclpp-perf`: the benchmark tool of mscclpp-rs.
//!
//! Standalone it spawns one process per rank (`--ranks`, default one per GPU, 2 on the host
//! backend); under mpirun, torchrun or srun each process is one rank. Rank 0 prints the table.

mod args;
mod channels;
mod collective;
mod nccl;
mod p2p;
mod report;

use std::process::ExitCode;

use std::sync::Arc;

use clap::Parser;
use mscclpp::comm::Communicator;
use mscclpp::hal::{BackendKind, CollectiveKind, DataType, ReduceOp, Result};
use mscclpp::transports::Transport;

use args::{Args, Bench};
use mscclpp::launch::{self, Role};

fn main() -> ExitCode {
    mscclpp::init_logging();
    let args = Args::parse();
    if let Err(e) = args.validate() {
        eprintln!("mscclpp-perf: {e}");
        return ExitCode::from(2);
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
    let role = launch::role()?;
    if let Role::Parent = role {
        let backend = mscclpp::registry::select()?;
        let nranks = args.ranks.unwrap_or(match backend.kind() {
            BackendKind::Host => 2,
            _ => backend.device_count().max(2),
        });
        if backend.kind() == BackendKind::Host {
            // Comments go to stderr under -J so that stdout stays pure JSON lines.
            let say = |line: String| {
                if args.json {
                    eprintln!("{line}");
                } else {
                    println!("{line}");
                }
            };
            say("# no GPU backend available here: running on the host (CPU) backend".into());
            for o in mscclpp::registry::probe_all() {
                if let Err(e) = o.result {
                    say(format!("#   {}: {e}", o.kind));
                }
            }
        }
        let failed = launch::spawn_and_wait(nranks)?;
        return Ok(if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let boot = Arc::new(launch::bootstrap(&role)?);
    let backend = mscclpp::registry::select()?;
    let local = boot.local_rank().unwrap_or(boot.rank());
    let device = backend.open_device(local % backend.device_count().max(1))?;
    let kind = |b: &Bench| match b {
        Bench::Allgather => CollectiveKind::AllGather,
        Bench::Reducescatter => CollectiveKind::ReduceScatter,
        Bench::Broadcast => CollectiveKind::Broadcast,
        Bench::Alltoall => CollectiveKind::AllToAll,
        _ => CollectiveKind::AllReduce,
    };
    let bench = args.bench.clone().unwrap_or(Bench::Allreduce);
    let wrong = match bench {
        Bench::Allreduce
        | Bench::Allgather
        | Bench::Reducescatter
        | Bench::Broadcast
        | Bench::Alltoall => run_collective(
            args,
            Arc::new(Communicator::new(boot.clone(), device)),
            kind(&bench),
        )?,
        Bench::P2p => p2p::run(args, &boot, device)?,
        Bench::MemoryChannel => {
            channels::run_memory_channel(args, &Communicator::new(boot.clone(), device))?
        }
        Bench::PortChannel { transport } => {
            let t: Transport = transport.parse()?;
            channels::run_port_channel(args, &Communicator::new(boot.clone(), device), t)?
        }
    };
    if wrong > 0 {
        eprintln!(
            "mscclpp-perf: rank {}: {wrong} wrong values over all ranks",
            boot.rank()
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs one collective over the sizes; rank 0 prints. Returns the wrong elements (ours and
/// NCCL's) over all ranks.
fn run_collective(args: &Args, comm: Arc<Communicator>, kind: CollectiveKind) -> Result<u64> {
    let dtype: DataType = args.datatype.parse()?;
    let op: ReduceOp = args.op.parse()?;
    if args.root >= comm.nranks() {
        return Err(mscclpp::Error::invalid(format!(
            "--root {} is not a rank of {}",
            args.root,
            comm.nranks()
        )));
    }
    let sizes = args.sizes();
    let max = sizes.last().copied().unwrap_or(0);
    let bench = collective::Bench::new(comm.clone(), max, args.baseline.is_some(), args.register)?;
    let spec = collective::Spec {
        kind,
        dtype,
        op,
        root: args.root,
    };
    let lead = comm.rank() == 0;
    let info = comm.device().info();
    let nranks = comm.nranks();
    let factor = collective::bus_factor(kind, nranks);
    if lead && !args.json {
        println!(
            "# mscclpp-perf {}: {nranks} ranks on the {} backend ({}), {dtype}, op {op}, root {}, {}, {} iterations after {} warm-up{}{}",
            kind.name(),
            info.backend,
            info.name,
            args.root,
            if args.cudagraph > 0 {
                format!("graph-timed ({} calls per graph)", args.cudagraph)
            } else {
                "eager launches".to_string()
            },
            args.iters,
            args.warmup,
            if args.register {
                "; our buffers registered"
            } else {
                ""
            },
            bench.nccl_version().map_or(String::new(), |v| format!(
                "; baseline NCCL {v} on the same buffers and stream"
            ))
        );
        println!(
            "# {:>12} {:>12} {:>9} {:>6} | {:>10} {:>8} {:>8} {:>7} | {:>10} {:>8} {:>8} {:>7} | {:>6}",
            "size(B)",
            "count",
            "type",
            "op",
            "time(us)",
            "algbw",
            "busbw",
            "#wrong",
            "nccl(us)",
            "algbw",
            "busbw",
            "#wrong",
            "speedup"
        );
    }
    let mut wrong = 0;
    // One untimed pass over the first size: the first calls of a process pay for module loading,
    // first-touch mappings and clock ramp-up, which short warm-ups left in the first row.
    if let Some(&first) = sizes.first() {
        if let Some(m) = bench.measure(args, &spec, first)? {
            wrong += m.wrong + m.nccl.map_or(0, |(_, w)| w);
        }
    }
    for size in sizes {
        let Some(m) = bench.measure(args, &spec, size)? else {
            continue;
        };
        wrong += m.wrong + m.nccl.map_or(0, |(_, w)| w);
        if !lead {
            continue;
        }
        let alg = |us: f64| m.size as f64 / us / 1e3;
        if args.json {
            let nccl = m.nccl.map_or("null".to_string(), |(t, w)| {
                format!(
                    "{{\"time_us\":{t:.3},\"algbw\":{:.3},\"busbw\":{:.3},\"wrong\":{w}}}",
                    alg(t),
                    alg(t) * factor
                )
            });
            println!(
                "{{\"collective\":\"{}\",\"size\":{},\"count\":{},\"type\":\"{dtype}\",\"op\":\"{op}\",\"root\":{},\"nranks\":{nranks},\"time_us\":{:.3},\"algbw\":{:.3},\"busbw\":{:.3},\"wrong\":{},\"nccl\":{nccl}}}",
                kind.name(),
                m.size,
                m.count,
                args.root,
                m.us,
                alg(m.us),
                alg(m.us) * factor,
                m.wrong
            );
        } else {
            let (nt, na, nb, nw, sp) = match m.nccl {
                Some((t, w)) => (
                    format!("{t:.2}"),
                    format!("{:.2}", alg(t)),
                    format!("{:.2}", alg(t) * factor),
                    w.to_string(),
                    format!("{:.2}", t / m.us),
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into(), "-".into()),
            };
            println!(
                "  {:>12} {:>12} {:>9} {:>6} | {:>10.2} {:>8.2} {:>8.2} {:>7} | {:>10} {:>8} {:>8} {:>7} | {:>6}",
                m.size,
                m.count,
                dtype.name(),
                op.name(),
                m.us,
                alg(m.us),
                alg(m.us) * factor,
                m.wrong,
                nt,
                na,
                nb,
                nw,
                sp
            );
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
    if lead && !args.json {
        println!(
            "# wrong values (ours and baseline, all ranks): {wrong} {}",
            if wrong == 0 { "OK" } else { "FAILED" }
        );
    }
    Ok(wrong)
}
