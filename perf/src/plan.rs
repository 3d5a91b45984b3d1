//! `mscclpp-perf plan FILE...`: MSCCL++ execution plans run by the executor, timed and checked
//! beside the built-in algorithm of the same collective (`Collectives::run`) and, with
//! `--baseline nccl`, beside NCCL, on the same buffers (in the plan's in-place or out-of-place
//! arrangement) and stream. Each size is checked after one execution on fresh inputs (in-place
//! plans overwrite their input, so results of the timed repetitions are not checked), then timed.

use std::path::PathBuf;
use std::sync::Arc;

use mscclpp::collectives::{CollectiveCall, CollectiveKind, Collectives};
use mscclpp::comm::Communicator;
use mscclpp::executor::flat::{Sizes, flatten};
use mscclpp::executor::{Executor, Plan};
use mscclpp::hal::{
    Api, BufferSlice, DataType, DeviceApi, Error, MemoryKind, ReduceOp, Result, Stream,
};
use mscclpp::typed::{PerBackend, by_backend};

use crate::args::Args;
use crate::collective::{Spec, bus_factor, check, time_calls, value};
use crate::nccl::Nccl;
use crate::report::{Baseline, Row, Table};

/// The collective a plan performs, by its `collective` field.
fn kind_of(plan: &Plan) -> Result<CollectiveKind> {
    Ok(match plan.collective.as_str() {
        "allreduce" => CollectiveKind::AllReduce,
        "allgather" => CollectiveKind::AllGather,
        "reducescatter" => CollectiveKind::ReduceScatter,
        "alltoall" => CollectiveKind::AllToAll,
        "broadcast" => CollectiveKind::Broadcast,
        other => {
            return Err(Error::unavailable(
                format!("plan {} of collective {other:?}", plan.name),
                "mscclpp-perf plan checks allreduce, allgather, reducescatter, alltoall and broadcast plans",
            ));
        }
    })
}

/// " on H hosts" where the ranks span several (by their host identities), else nothing.
fn hosts_note(comm: &Communicator) -> String {
    let hosts = comm.bootstrap().hosts();
    let count = hosts.iter().collect::<std::collections::HashSet<_>>().len();
    if count > 1 {
        format!(" on {count} hosts")
    } else {
        String::new()
    }
}

/// One rank's buffers for a plan and a size: where the input is written and what the plan and
/// the built-in algorithm get as send and receive buffers.
struct Slices {
    send: BufferSlice,
    recv: BufferSlice,
}

/// Runs every plan over the sizes; rank 0 prints. Returns the wrong elements (the plans', the
/// built-in algorithm's and NCCL's) over all ranks.
pub fn run(args: &Args, comm: Arc<Communicator>, files: &[PathBuf]) -> Result<u64> {
    struct Run<'a>(&'a Args, &'a [PathBuf]);
    impl PerBackend for Run<'_> {
        type Out = u64;
        fn on<A: Api>(self, comm: Arc<Communicator>) -> Result<u64> {
            run_on::<A>(self.0, comm, self.1)
        }
    }
    by_backend(comm, Run(args, files))
}

/// [`run`] with the built-in algorithms over backend `A`.
fn run_on<A: Api>(args: &Args, comm: Arc<Communicator>, files: &[PathBuf]) -> Result<u64> {
    let dtype: DataType = args.datatype.parse()?;
    let op: ReduceOp = args.op.parse()?;
    let (rank, n) = (comm.rank(), comm.nranks());
    let device = comm.device().clone();
    let exec = Executor::new(comm.clone())?;
    let coll = Collectives::<A>::new(comm.clone())?;
    let typed = DeviceApi::create_stream(&*A::device_of(&device)?)?;
    let stream = A::erase_stream(typed.clone());
    let sizes = args.sizes();
    let max = sizes.last().copied().unwrap_or(0).max(1);
    let input = device.alloc(max, MemoryKind::Device)?;
    let output = device.alloc(max, MemoryKind::Device)?;
    let info = device.info();
    let nccl = match args.baseline {
        Some(_) => Some(Nccl::for_communicator(&comm, &*stream)?),
        None => None,
    };
    let mut table =
        Table::new(args.json_out(), rank == 0, true).with_baselines(if nccl.is_some() {
            &["builtin", "nccl"]
        } else {
            &["builtin"]
        });
    table.preamble(
        &format!(
            "mscclpp-perf plan: {} plan file(s); {n} ranks{} on the {} backend ({})",
            files.len(),
            hosts_note(&comm),
            info.backend,
            info.name
        ),
        &crate::report::Meta {
            bench: "plan",
            backend: info.backend.to_string(),
            device: info.name.clone(),
            nranks: n,
            timing: args.timing(),
        },
    )?;
    for file in files {
        let plan = Plan::from_file(file, n)?;
        let kind = kind_of(&plan)?;
        let spec = Spec {
            kind,
            dtype,
            op,
            root: args.root,
        };
        let factor = bus_factor(kind, n);
        table.comment(&format!(
            "mscclpp-perf plan {} ({}): {} {}, protocol {:?}, {}, {} threads per block, messages {}..={} bytes; {n} ranks on the {} backend ({}), {dtype}, op {op}, {}, {} iterations after {} warm-up; {}",
            plan.name,
            file.display(),
            plan.collective,
            if plan.inplace { "in place" } else { "out of place" },
            plan.protocol,
            plan.gpus
                .get(rank)
                .map_or(0, |g| g.threadblocks.len())
                .to_string()
                + " threadblocks",
            plan.threads_per_block,
            plan.min_message_size,
            plan.max_message_size,
            info.backend,
            info.name,
            args.timing(),
            args.iters,
            args.warmup,
            match &nccl {
                Some(nc) => format!(
                    "baselines: the built-in {} and NCCL {} on the same buffers and stream",
                    kind.name(),
                    nc.version
                ),
                None => format!(
                    "baseline: the built-in {} on the same buffers and stream",
                    kind.name()
                ),
            },
        ));
        table.header();
        let mut skipped = Vec::new();
        for &size in &sizes {
            let per = match kind {
                CollectiveKind::AllReduce | CollectiveKind::Broadcast => 1,
                _ => n,
            };
            let count = size / (dtype.size() * per);
            if count == 0 {
                continue;
            }
            let (in_e, out_e) = kind.buffer_elements(count as u64, n as u64);
            let (in_b, out_b) = (in_e as usize * dtype.size(), out_e as usize * dtype.size());
            // The plan's own limits and chunking decide which sizes it runs (every rank must
            // agree: a rank's chunk counts are its own).
            let fits = flatten(
                &plan,
                rank,
                Sizes {
                    input: in_b as u64,
                    output: out_b as u64,
                },
            )
            .is_ok();
            let all = comm.bootstrap().all_gather(&[u8::from(fits)])?;
            if all.iter().any(|b| b.first() != Some(&1)) {
                skipped.push(size);
                continue;
            }
            let s = slices(&plan, kind, rank, &input, &output, in_b, out_b)?;
            let mut data = Vec::with_capacity(in_b);
            for i in 0..in_e as usize {
                dtype.encode_f64(f64::from(value(&spec, n, rank, i)), &mut data);
            }
            let run_plan = || exec.execute(&plan, &s.send, &s.recv, dtype, Some(op), &*stream);
            let run_builtin = || {
                let call = CollectiveCall::new(kind, &s.send, &s.recv, count, dtype)
                    .op(op)
                    .root(args.root);
                coll.run(&call, &typed)
            };
            let wrong_plan = check_once(
                args,
                &comm,
                &*stream,
                &s,
                &data,
                &output,
                &run_plan,
                |got| check(&spec, n, rank, count, got),
            )?;
            let us_plan = time_calls(args, &comm, &*stream, &run_plan)?;
            let wrong_builtin = check_once(
                args,
                &comm,
                &*stream,
                &s,
                &data,
                &output,
                &run_builtin,
                |got| check(&spec, n, rank, count, got),
            )?;
            let us_builtin = time_calls(args, &comm, &*stream, &run_builtin)?;
            let mut measured = vec![(us_plan, wrong_plan), (us_builtin, wrong_builtin)];
            if let Some(nc) = &nccl {
                // The plan's own arrangement: in place, NCCL gets the same aliased pointers.
                let h = stream.native_handle().unwrap_or(0);
                let run_nccl = || {
                    nc.run(
                        kind,
                        s.send.ptr().0,
                        s.recv.ptr().0,
                        count,
                        dtype,
                        op,
                        args.root,
                        h,
                    )
                };
                let wrong = check_once(
                    args,
                    &comm,
                    &*stream,
                    &s,
                    &data,
                    &output,
                    &run_nccl,
                    |got| check(&spec, n, rank, count, got),
                )?;
                measured.push((time_calls(args, &comm, &*stream, &run_nccl)?, wrong));
            }
            let all = slowest_and_wrong(&comm, &measured)?;
            let [(t0, w0), baselines @ ..] = all.as_slice() else {
                return Err(Error::Internal("no plan figures measured".into()));
            };
            let bytes = in_b.max(out_b);
            let alg = |us: f64| bytes as f64 / us / 1e3;
            // The built-in algorithm first, then NCCL: the table's baseline order.
            let mut figures = baselines.iter().map(|&(t, w)| {
                Some(Baseline {
                    time_us: t,
                    cpu_us: None,
                    algbw_gbps: alg(t),
                    busbw_gbps: alg(t) * factor,
                    wrong: w,
                })
            });
            let builtin = figures.next().flatten();
            let more: Vec<Option<Baseline>> = figures.collect();
            table.row_with(
                &Row {
                    bench: "plan",
                    bytes,
                    count,
                    dtype: dtype.name(),
                    op: op.name(),
                    root: None,
                    nranks: n,
                    time_us: *t0,
                    cpu_us: None,
                    algbw_gbps: alg(*t0),
                    busbw_gbps: alg(*t0) * factor,
                    wrong: (args.check != 0).then_some(*w0),
                    baseline: builtin,
                    algo: None,
                },
                &more,
            );
        }
        if !skipped.is_empty() {
            table.comment(&format!(
                "plan {}: sizes outside its message range or chunking skipped: {skipped:?}",
                plan.name
            ));
        }
    }
    table.footer();
    Ok(table.wrong_total())
}

/// Over all ranks, for each `(time, wrong)` measured here: the slowest rank's time and the sum
/// of the wrong elements, in the same order.
fn slowest_and_wrong(comm: &Communicator, measured: &[(f64, u64)]) -> Result<Vec<(f64, u64)>> {
    let mut msg = Vec::with_capacity(16 * measured.len());
    for (t, w) in measured {
        msg.extend_from_slice(&t.to_le_bytes());
        msg.extend_from_slice(&w.to_le_bytes());
    }
    let all = comm.bootstrap().all_gather(&msg)?;
    let mut out = vec![(0f64, 0u64); measured.len()];
    for b in &all {
        if b.len() != msg.len() {
            return Err(Error::malformed(
                "perf result",
                format!("{} bytes instead of {}", b.len(), msg.len()),
            ));
        }
        for (k, (t, w)) in out.iter_mut().enumerate() {
            let word = |at: usize| -> Result<[u8; 8]> {
                b.get(at..at + 8)
                    .and_then(|x| x.try_into().ok())
                    .ok_or_else(|| Error::malformed("perf result", "a word cut short"))
            };
            *t = t.max(f64::from_le_bytes(word(16 * k)?));
            *w += u64::from_le_bytes(word(16 * k + 8)?);
        }
    }
    Ok(out)
}

/// The send and receive buffers of `plan` for one size: out of place, the input and output
/// buffers; in place, both inside the output buffer where MSCCL++ puts them (all-gather: the
/// input is the rank's block of the output; reduce-scatter: the output is the rank's block of
/// the input).
fn slices(
    plan: &Plan,
    kind: CollectiveKind,
    rank: usize,
    input: &mscclpp::hal::DeviceBuffer,
    output: &mscclpp::hal::DeviceBuffer,
    in_b: usize,
    out_b: usize,
) -> Result<Slices> {
    if !plan.inplace {
        return Ok(Slices {
            send: input.slice(..in_b)?,
            recv: output.slice(..out_b)?,
        });
    }
    Ok(match kind {
        CollectiveKind::AllGather => Slices {
            send: output.slice(rank * in_b..(rank + 1) * in_b)?,
            recv: output.slice(..out_b)?,
        },
        CollectiveKind::ReduceScatter => Slices {
            send: output.slice(..in_b)?,
            recv: output.slice(rank * out_b..(rank + 1) * out_b)?,
        },
        _ => Slices {
            send: output.slice(..in_b)?,
            recv: output.slice(..out_b)?,
        },
    })
}

/// Writes the input, poisons the rest of the output, runs `call` once and counts wrong output
/// elements (0 without checking: `-c 0`).
#[allow(clippy::too_many_arguments)]
fn check_once(
    args: &Args,
    comm: &Communicator,
    stream: &dyn Stream,
    s: &Slices,
    data: &[u8],
    output: &mscclpp::hal::DeviceBuffer,
    call: &dyn Fn() -> Result<()>,
    count_wrong: impl Fn(&[u8]) -> u64,
) -> Result<u64> {
    stream.fill(&output.full(), 0xA5)?;
    stream.write_from_host(&s.send, data)?;
    stream.synchronize()?;
    // Every rank's input is in place before anyone reads it.
    comm.bootstrap().barrier()?;
    call()?;
    stream.synchronize()?;
    // As in time_calls: the results of calls whose kernels gave up are no results.
    comm.check_live()?;
    let wrong = if args.check == 0 {
        0
    } else {
        let mut got = vec![0u8; s.recv.len()];
        stream.read_to_host(&mut got, &s.recv)?;
        count_wrong(&got)
    };
    // Nobody poisons its output for the next run while a peer still writes into it.
    comm.bootstrap().barrier()?;
    Ok(wrong)
}
