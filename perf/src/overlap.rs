//! `mscclpp-perf overlap`: communication beside compute. A compute stream runs a GEMM-like
//! kernel that occupies every SM (`mscclpp_perf::bench_compute`, about `--compute-us` per launch)
//! while the communication stream runs all-gathers and reduce-scatters; per size and path (our
//! SM kernels as the policy picks them, our copy-engine path, NCCL with `--baseline nccl`) it
//! prints compute alone, communication alone, both overlapped, the overlap efficiency
//! `max(alone) / overlapped` and the compute's slowdown. Every communication result is checked.

use std::sync::Arc;

use mscclpp::collectives::{AlgorithmId, CollectiveCall, CollectiveKind, Collectives};
use mscclpp::comm::Communicator;
use mscclpp::hal::{
    Api, BufferSlice, DataType, DeviceApi, DeviceBuffer, DynKernel, DynStream, Error, Event,
    LaunchConfig, MemoryKind, ReduceOp, Result, Stream,
};
use mscclpp::typed::{PerBackend, by_backend};
use mscclpp_perf::bench_compute::{COMPUTE, ComputeArgs, MODULE as COMPUTE_MODULE};

use crate::args::Args;
use crate::collective::{Spec, bus_factor, check, value};
use crate::nccl::Nccl;

/// Which implementation moves the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// Our kernels, as the policy chooses them.
    Sm,
    /// Our copy-engine algorithm.
    Ce,
    /// The real NCCL on the communication stream.
    Nccl,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Sm => "sm",
            Path::Ce => "ce",
            Path::Nccl => "nccl",
        }
    }
}

/// The compute load: the kernel, its grid and operands, and the passes that make one launch
/// last about the asked time.
struct Compute {
    kernel: DynKernel<ComputeArgs>,
    cfg: LaunchConfig,
    _data: DeviceBuffer,
    _out: DeviceBuffer,
    args: ComputeArgs,
}

impl Compute {
    fn new(comm: &Communicator, stream: &DynStream, target_us: f64) -> Result<Compute> {
        let device = comm.device();
        let info = device.info();
        let kernel = DynKernel::<ComputeArgs>::load(&**device, &COMPUTE_MODULE, COMPUTE)?;
        let host = info.warp_size == 1;
        // GPUs: 8 blocks of 256 threads per SM fill every SM (2048 threads); 16 MiB of operands
        // stay in L2 between passes, as a GEMM's tiles mostly do. The host: one block per core.
        let (cfg, words) = if host {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
            (LaunchConfig::linear(cores.clamp(1, 8), 1), 4usize << 10)
        } else {
            (
                LaunchConfig::linear(info.multiprocessors.max(1) * 8, 256),
                4usize << 20,
            )
        };
        let data = device.alloc(words * 4, MemoryKind::Device)?;
        let out = device.alloc(
            cfg.num_blocks() as usize * cfg.block[0] as usize * 4,
            MemoryKind::Device,
        )?;
        // bf16 0x3f3f (about 0.75) everywhere: the accumulations converge, never overflow.
        stream.fill(&data.full(), 0x3f)?;
        let mut c = Compute {
            kernel,
            cfg,
            args: ComputeArgs {
                data: data.ptr().0,
                out: out.ptr().0,
                words: words as u64,
                passes: 1,
                fmas: 16,
            },
            _data: data,
            _out: out,
        };
        // Calibrate: the time of one pass (after a warm-up launch), then as many passes as make
        // a launch last `target_us`.
        let (e0, e1) = (device.create_event()?, device.create_event()?);
        c.launch(stream)?;
        stream.record(&*e0)?;
        for _ in 0..3 {
            c.launch(stream)?;
        }
        stream.record(&*e1)?;
        stream.synchronize()?;
        let pass_us = (e1.elapsed_ms_since(&*e0)? * 1e3 / 3.0).max(1e-3);
        c.args.passes = (target_us / pass_us).round().clamp(1.0, 1e6) as u32;
        Ok(c)
    }

    fn launch(&self, stream: &DynStream) -> Result<()> {
        // SAFETY: `data` and `out` are held by `self` and hold `words` words and one word per
        // thread of `cfg`; the caller keeps `self` alive until the stream has passed the launch
        // (every measurement synchronises before returning).
        unsafe { self.kernel.launch(stream, self.cfg, &self.args) }
    }
}

/// One rank's overlap benchmark.
struct Overlap<A: Api> {
    comm: Arc<Communicator>,
    coll: Collectives<A>,
    /// The communication stream, as backend `A`'s type (our calls) and as a trait object.
    comm_typed: Arc<A::Stream>,
    comm_stream: Arc<dyn Stream>,
    compute_stream: Arc<dyn Stream>,
    input: DeviceBuffer,
    output: DeviceBuffer,
    nccl: Option<Nccl>,
    compute: Compute,
    events: [Arc<dyn Event>; 4],
}

/// Times of one (size, path), this rank, milliseconds, and the wrong elements.
#[derive(Debug, Clone, Copy, Default)]
struct Times {
    compute_alone: f64,
    comm_alone: f64,
    overlapped: f64,
    compute_overlapped: f64,
    wrong: u64,
    /// Communication calls of the row (the same on every rank).
    calls: usize,
}

impl<A: Api> Overlap<A> {
    /// Runs `calls` communication calls on the communication stream; ms from the first to the
    /// end of the last.
    fn time_comm(&self, calls: usize, call: &dyn Fn() -> Result<()>) -> Result<f64> {
        let [e0, e1, ..] = &self.events;
        self.comm_stream.synchronize()?;
        self.comm.bootstrap().barrier()?;
        self.comm_stream.record(&**e0)?;
        for _ in 0..calls {
            call()?;
        }
        self.comm_stream.record(&**e1)?;
        self.comm_stream.synchronize()?;
        self.comm.check_live()?;
        e1.elapsed_ms_since(&**e0)
    }

    fn time_compute(&self, launches: usize) -> Result<f64> {
        let [e0, e1, ..] = &self.events;
        self.compute_stream.synchronize()?;
        self.compute_stream.record(&**e0)?;
        for _ in 0..launches {
            self.compute.launch(&*self.compute_stream)?;
        }
        self.compute_stream.record(&**e1)?;
        self.compute_stream.synchronize()?;
        e1.elapsed_ms_since(&**e0)
    }

    /// Both at once, started together: (ms to the end of both, ms to the end of the compute).
    fn time_both(
        &self,
        launches: usize,
        calls: usize,
        call: &dyn Fn() -> Result<()>,
    ) -> Result<(f64, f64)> {
        let [start, compute_end, end, _] = &self.events;
        self.comm_stream.synchronize()?;
        self.compute_stream.synchronize()?;
        self.comm.bootstrap().barrier()?;
        self.comm_stream.record(&**start)?;
        self.compute_stream.wait_event(&**start)?;
        for i in 0..launches.max(calls) {
            if i < launches {
                self.compute.launch(&*self.compute_stream)?;
            }
            if i < calls {
                call()?;
            }
        }
        self.compute_stream.record(&**compute_end)?;
        self.comm_stream.wait_event(&**compute_end)?;
        self.comm_stream.record(&**end)?;
        self.comm_stream.synchronize()?;
        self.comm.check_live()?;
        Ok((
            end.elapsed_ms_since(&**start)?,
            compute_end.elapsed_ms_since(&**start)?,
        ))
    }

    fn measure(
        &self,
        args: &Args,
        spec: &Spec,
        path: Path,
        size: usize,
    ) -> Result<Option<(usize, Times)>> {
        let n = self.comm.nranks();
        let rank = self.comm.rank();
        let count = size / (spec.dtype.size() * n);
        if count == 0 {
            return Ok(None);
        }
        let (in_e, out_e) = spec.kind.buffer_elements(count as u64, n as u64);
        let (in_b, out_b) = (
            in_e as usize * spec.dtype.size(),
            out_e as usize * spec.dtype.size(),
        );
        let input: BufferSlice = self.input.slice(..in_b)?;
        let output: BufferSlice = self.output.slice(..out_b)?;
        let mut data = Vec::with_capacity(in_b);
        for i in 0..in_e as usize {
            spec.dtype
                .encode_f64(f64::from(value(spec, n, rank, i)), &mut data);
        }
        self.comm_stream.write_from_host(&input, &data)?;
        drop(data);
        let handle = self.comm_stream.native_handle().unwrap_or(0);
        let call = || -> Result<()> {
            match path {
                Path::Nccl => {
                    let nc = self
                        .nccl
                        .as_ref()
                        .ok_or_else(|| Error::Internal("the NCCL path without NCCL".into()))?;
                    nc.run(
                        spec.kind,
                        input.ptr().0,
                        output.ptr().0,
                        count,
                        spec.dtype,
                        spec.op,
                        spec.root,
                        handle,
                    )
                }
                Path::Sm | Path::Ce => {
                    let call = CollectiveCall::new(spec.kind, &input, &output, count, spec.dtype)
                        .op(spec.op)
                        .algorithm((path == Path::Ce).then_some(AlgorithmId::Ce));
                    self.coll.run(&call, &self.comm_typed)
                }
            }
        };
        // Warm-up, then the time of one call alone, which sets how many calls span about as
        // long as the compute launches beside them.
        for _ in 0..args.warmup.max(1) {
            call()?;
        }
        let one = self.time_comm(args.iters, &call)? / args.iters as f64;
        let per_launch = self.time_compute(2)? / 2.0;
        // Both sides last about as long, at least four compute launches and `-n` calls each.
        let calls = args
            .iters
            .max((4.0 * per_launch / one.max(1e-6)).ceil() as usize)
            .min(100_000);
        // Every rank makes the same calls: the most any rank wants.
        let calls = self
            .comm
            .bootstrap()
            .all_gather(&(calls as u64).to_le_bytes())?
            .iter()
            .map(|b| u64::from_le_bytes(b.as_slice().try_into().unwrap_or([0; 8])) as usize)
            .max()
            .unwrap_or(calls)
            .max(calls);
        let launches = ((calls as f64 * one / per_launch).round() as usize).max(1);
        let comm_alone = self.time_comm(calls, &call)?;
        let compute_alone = self.time_compute(launches)?;
        self.comm_stream.fill(&output, 0xA5)?;
        let (overlapped, compute_overlapped) = self.time_both(launches, calls, &call)?;
        let wrong = if args.check == 0 {
            0
        } else {
            let mut got = vec![0u8; out_b];
            self.comm_stream.read_to_host(&mut got, &output)?;
            check(spec, n, rank, count, &got)
        };
        Ok(Some((
            count,
            Times {
                compute_alone,
                comm_alone,
                overlapped,
                compute_overlapped,
                wrong,
                calls,
            },
        )))
    }
}

/// The slowest rank's times and everyone's wrong elements.
fn gather(comm: &Communicator, t: &Times) -> Result<Times> {
    let mut msg = Vec::with_capacity(40);
    for v in [
        t.compute_alone,
        t.comm_alone,
        t.overlapped,
        t.compute_overlapped,
    ] {
        msg.extend_from_slice(&v.to_le_bytes());
    }
    msg.extend_from_slice(&t.wrong.to_le_bytes());
    let all = comm.bootstrap().all_gather(&msg)?;
    let mut out = Times {
        calls: t.calls,
        ..Times::default()
    };
    for b in &all {
        if b.len() != 40 {
            return Err(Error::malformed(
                "overlap result",
                format!("{} bytes instead of 40", b.len()),
            ));
        }
        let f = |k: usize| f64::from_le_bytes(b[k * 8..k * 8 + 8].try_into().unwrap_or([0; 8]));
        out.compute_alone = out.compute_alone.max(f(0));
        out.comm_alone = out.comm_alone.max(f(1));
        out.overlapped = out.overlapped.max(f(2));
        out.compute_overlapped = out.compute_overlapped.max(f(3));
        out.wrong += u64::from_le_bytes(b[32..40].try_into().unwrap_or([0; 8]));
    }
    Ok(out)
}

/// Runs the overlap benchmark; rank 0 prints. Returns the wrong elements over all ranks.
pub fn run(
    args: &Args,
    comm: Arc<Communicator>,
    compute_us: f64,
    kinds: &[CollectiveKind],
) -> Result<u64> {
    struct Run<'a>(&'a Args, f64, &'a [CollectiveKind]);
    impl PerBackend for Run<'_> {
        type Out = u64;
        fn on<A: Api>(self, comm: Arc<Communicator>) -> Result<u64> {
            run_on::<A>(self.0, comm, self.1, self.2)
        }
    }
    by_backend(comm, Run(args, compute_us, kinds))
}

/// [`run`] with our collectives over backend `A`.
fn run_on<A: Api>(
    args: &Args,
    comm: Arc<Communicator>,
    compute_us: f64,
    kinds: &[CollectiveKind],
) -> Result<u64> {
    let dtype: DataType = args.datatype.parse()?;
    let op: ReduceOp = args.op.parse()?;
    let sizes = args.sizes();
    let max = sizes.last().copied().unwrap_or(0);
    let device = comm.device().clone();
    let coll = Collectives::<A>::new(comm.clone())?;
    let comm_typed = DeviceApi::create_stream(&*A::device_of(&device)?)?;
    let comm_stream = A::erase_stream(comm_typed.clone());
    let compute_stream = device.create_stream()?;
    let nccl = match args.baseline {
        Some(_) => Some(Nccl::for_communicator(&comm, &*comm_stream)?),
        None => None,
    };
    let compute = Compute::new(&comm, &*compute_stream, compute_us)?;
    let bench = Overlap {
        coll,
        input: device.alloc(max.max(1), MemoryKind::Device)?,
        output: device.alloc(max.max(1), MemoryKind::Device)?,
        nccl,
        compute,
        events: [
            device.create_event()?,
            device.create_event()?,
            device.create_event()?,
            device.create_event()?,
        ],
        comm: comm.clone(),
        comm_typed,
        comm_stream,
        compute_stream,
    };
    let rank0 = comm.rank() == 0;
    let n = comm.nranks();
    let info = device.info();
    // Comments wrapped at the report's width; on standard error under `-J -` (standard output
    // stays JSON lines).
    let say = |line: String| {
        if !rank0 {
            return;
        }
        let lines = match line.strip_prefix("# ") {
            Some(text) => crate::report::wrap_comment(text),
            None => vec![line],
        };
        for l in lines {
            if args.json_lines() {
                eprintln!("{l}");
            } else {
                println!("{l}");
            }
        }
    };
    // `-J FILE`: one document of the rows (rank 0 writes it).
    let mut doc = match (rank0, args.json_out()) {
        (true, crate::report::JsonOut::File(f)) => {
            let meta = serde_json::json!({"meta": {
                "bench": "overlap",
                "backend": info.backend.to_string(),
                "device": info.name.clone(),
                "nranks": n,
                "command": crate::report::command_line(),
                "machine": crate::report::machine(),
                "version": env!("CARGO_PKG_VERSION"),
            }});
            let d = crate::report::JsonDoc::create(&f, meta).map_err(Error::invalid)?;
            say(format!("# Writing JSON output to {}", d.path().display()));
            Some(d)
        }
        _ => None,
    };
    let (mut busbw_sum, mut rows) = (0.0f64, 0usize);
    let per_launch = bench.time_compute(3)? / 3.0;
    say(format!(
        "# mscclpp-perf overlap: {n} ranks on the {} backend ({}), {dtype}, op {op}; compute: {} blocks of {} threads, {} passes of {} FMA rounds over {} KiB, {:.3} ms per launch (rank {}); at least {} calls per row (and at least 4 launches' time) after {} warm-up{}",
        info.backend,
        info.name,
        bench.compute.cfg.grid[0],
        bench.compute.cfg.block[0],
        bench.compute.args.passes,
        bench.compute.args.fmas,
        bench.compute.args.words * 4 / 1024,
        per_launch,
        comm.rank(),
        args.iters,
        args.warmup,
        bench.nccl.as_ref().map_or(String::new(), |nc| format!(
            "; NCCL {} on its own communicator, the same buffers and communication stream",
            nc.version
        )),
    ));
    say("# efficiency = max(compute alone, comm alone) / overlapped; slowdown = compute's time overlapped / alone; times: all calls or launches of the row, slowest rank".into());
    if !args.json_lines() {
        say(format!(
            "{:>14} {:>5} {:>8} {:>12} {:>12} {:>12} {:>12} {:>10} {:>9} {:>10} {:>7}",
            "collective",
            "path",
            "algo",
            "size(B)",
            "compute(ms)",
            "comm(ms)",
            "both(ms)",
            "efficiency",
            "slowdown",
            "busbw(GB/s)",
            "#wrong"
        ));
    }
    let mut paths = vec![Path::Sm, Path::Ce];
    if bench.nccl.is_some() {
        paths.push(Path::Nccl);
    }
    let mut wrong_total = 0u64;
    for &kind in kinds {
        let spec = Spec {
            kind,
            dtype,
            op,
            root: 0,
        };
        for &size in &sizes {
            for &path in &paths {
                let Some((count, t)) = bench.measure(args, &spec, path, size)? else {
                    continue;
                };
                let t = gather(&comm, &t)?;
                wrong_total += t.wrong;
                let algo = match path {
                    Path::Nccl => "nccl",
                    _ => {
                        let block = (count * dtype.size()) as u64;
                        match path {
                            Path::Ce => AlgorithmId::Ce.name(),
                            _ => bench.coll.algorithm(kind, block).name(),
                        }
                    }
                };
                let bytes = count * dtype.size() * n;
                let efficiency = t.compute_alone.max(t.comm_alone) / t.overlapped;
                let slowdown = t.compute_overlapped / t.compute_alone;
                let busbw =
                    bytes as f64 * t.calls as f64 / (t.comm_alone * 1e6) * bus_factor(kind, n);
                if !rank0 {
                    continue;
                }
                busbw_sum += busbw;
                rows += 1;
                let json = format!(
                    "{{\"bench\":\"overlap\",\"collective\":\"{}\",\"path\":\"{}\",\"algo\":\"{algo}\",\"bytes\":{bytes},\"count\":{count},\"dtype\":\"{}\",\"nranks\":{n},\"compute_ms\":{:.4},\"comm_ms\":{:.4},\"overlapped_ms\":{:.4},\"compute_overlapped_ms\":{:.4},\"efficiency\":{efficiency:.4},\"slowdown\":{slowdown:.4},\"comm_busbw_gbps\":{busbw:.2},\"wrong\":{}}}",
                    kind.name(),
                    path.name(),
                    dtype.name(),
                    t.compute_alone,
                    t.comm_alone,
                    t.overlapped,
                    t.compute_overlapped,
                    t.wrong
                );
                if let Some(d) = doc.as_mut() {
                    if let Ok(v) = serde_json::from_str(&json) {
                        d.push_value(v);
                    }
                }
                if args.json_lines() {
                    println!("{json}");
                } else {
                    println!(
                        "{:>14} {:>5} {:>8} {:>12} {:>12.3} {:>12.3} {:>12.3} {:>10.3} {:>9.3} {:>10.1} {:>7}",
                        kind.name(),
                        path.name(),
                        algo,
                        bytes,
                        t.compute_alone,
                        t.comm_alone,
                        t.overlapped,
                        efficiency,
                        slowdown,
                        busbw,
                        t.wrong
                    );
                }
            }
        }
    }
    say(format!("# wrong elements: {wrong_total}"));
    // nccl-tests' summary lines (scripts parse them); the average is of the communication
    // alone's bus bandwidth.
    let avg = if rows == 0 {
        0.0
    } else {
        busbw_sum / rows as f64
    };
    say(format!(
        "# {:<20} : {} {}",
        "Out of bounds values",
        wrong_total,
        if wrong_total == 0 { "OK" } else { "FAILED" }
    ));
    say(format!(
        "# {:<20} : {}",
        "Avg bus bandwidth",
        crate::report::c_g(avg)
    ));
    if let Some(d) = doc.as_mut() {
        d.finish(wrong_total, avg);
    }
    Ok(wrong_total)
}
