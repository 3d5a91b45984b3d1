//! Collective benchmarks: our collectives beside NCCL (`--baseline nccl`), same buffers, same
//! stream, same run; every result checked against exactly representable expected values.

use std::sync::Arc;

use mscclpp::collectives::{CollectiveCall, CollectiveKind, Collectives, DEFAULT_SLOT_BYTES};
use mscclpp::comm::Communicator;
use mscclpp::hal::{
    Api, BackendKind, BufferSlice, DataType, DeviceApi, DeviceBuffer, Dyn, Error, MemoryKind,
    ReduceOp, Result, Stream,
};

use crate::args::Args;
use crate::nccl::Nccl;
use crate::report::{Baseline, Meta, Row, Table};

/// What one row compares.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The collective.
    pub kind: CollectiveKind,
    /// Element type.
    pub dtype: DataType,
    /// Operator (reductions).
    pub op: ReduceOp,
    /// Root (broadcast).
    pub root: usize,
}

/// Input element `i` of rank `r`: small integers, exact in every type and in every reduction of
/// up to 8 ranks (products stay powers of two).
pub(crate) fn value(spec: &Spec, r: usize, i: usize) -> u32 {
    if spec.op == ReduceOp::Prod && spec.kind.reduces() {
        1 + ((i + r) % 2) as u32
    } else {
        ((i * 7 + r * 3 + 1) % 16) as u32
    }
}

fn expected(spec: &Spec, n: usize, rank: usize, count: usize, j: usize) -> f64 {
    let reduce = |i: usize| {
        let vals = (0..n).map(|p| f64::from(value(spec, p, i)));
        match spec.op {
            ReduceOp::Sum => vals.sum::<f64>(),
            ReduceOp::Prod => vals.product(),
            ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
            ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Avg => {
                let s: f64 = vals.sum();
                if matches!(spec.dtype, DataType::I32 | DataType::U32) {
                    (s / n as f64).trunc()
                } else {
                    s / n as f64
                }
            }
        }
    };
    match spec.kind {
        CollectiveKind::AllReduce => reduce(j),
        CollectiveKind::ReduceScatter => reduce(rank * count + j),
        CollectiveKind::AllGather => f64::from(value(spec, j / count, j % count)),
        CollectiveKind::Broadcast => f64::from(value(spec, spec.root, j)),
        CollectiveKind::AllToAll => f64::from(value(spec, j / count, rank * count + j % count)),
    }
}

/// Wrong output elements (`Avg` of floats gets a relative tolerance: the kernels divide in
/// float precision).
pub(crate) fn check(spec: &Spec, n: usize, rank: usize, count: usize, got: &[u8]) -> u64 {
    let s = spec.dtype.size();
    let tol = if spec.op == ReduceOp::Avg && !matches!(spec.dtype, DataType::I32 | DataType::U32) {
        match spec.dtype {
            DataType::F32 => 1e-6,
            DataType::F16 => 2e-3,
            _ => 1e-2,
        }
    } else {
        0.0
    };
    got.chunks_exact(s)
        .enumerate()
        .filter(|(j, b)| {
            let (g, w) = (spec.dtype.decode_f64(b), expected(spec, n, rank, count, *j));
            (g - w).abs() > tol * w.abs()
        })
        .count() as u64
}

/// One measured size.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Bytes of the larger buffer (nccl-tests' "size").
    pub size: usize,
    /// Elements per rank block.
    pub count: usize,
    /// Our time per call, µs (slowest rank).
    pub us: f64,
    /// Host time per call spent in our calls, µs (slowest rank).
    pub cpu_us: f64,
    /// Our wrong elements, all ranks.
    pub wrong: u64,
    /// NCCL's time, wrong elements and host time per call, when measured.
    pub nccl: Option<(f64, u64, f64)>,
    /// The algorithm our library ran (rank 0's choice; every rank agrees).
    pub algo: &'static str,
}

/// A zeroed host buffer of `len` bytes, or an error naming the size where this process cannot
/// have it (`vec!` and `Vec::with_capacity` abort the process instead).
pub(crate) fn host_bytes(len: usize, what: &str) -> Result<Vec<u8>> {
    let mut v = host_capacity(len, what)?;
    v.resize(len, 0);
    Ok(v)
}

/// An empty host buffer with room for `len` bytes, or an error naming the size.
pub(crate) fn host_capacity(len: usize, what: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        Error::invalid(format!(
            "{what}: cannot allocate {} of host memory; use a smaller -e",
            crate::args::human(len as u128)
        ))
    })?;
    Ok(v)
}

/// The collective benchmark of one rank.
pub struct Bench<A: Api = Dyn> {
    comm: Arc<Communicator>,
    coll: Collectives<A>,
    /// The stream our calls go on, as backend `A`'s type, and the same stream as a trait
    /// object (timing, NCCL, copies).
    typed: Arc<A::Stream>,
    stream: Arc<dyn Stream>,
    input: DeviceBuffer,
    output: DeviceBuffer,
    nccl: Option<Nccl>,
    /// The input is registered on every rank (`--register`): all-reduces may read it in place.
    registered: bool,
}

impl<A: Api> Bench<A> {
    /// Sets up buffers of `max` bytes, the collectives over backend `A` and (optionally) NCCL.
    pub fn new(
        comm: Arc<Communicator>,
        max: usize,
        baseline: bool,
        register: bool,
    ) -> Result<Bench<A>> {
        let device = comm.device().clone();
        let coll = Collectives::<A>::on_backend(comm.clone(), DEFAULT_SLOT_BYTES)?;
        let typed = DeviceApi::create_stream(&*A::device_of(&device)?)?;
        let stream = A::erase_stream(typed.clone());
        let input = device.alloc(max.max(1), MemoryKind::Device)?;
        let output = device.alloc(max.max(1), MemoryKind::Device)?;
        if register {
            coll.register(&input.full())?;
        }
        let nccl = if baseline {
            Some(Nccl::for_communicator(&comm, &*stream)?)
        } else {
            None
        };
        Ok(Bench {
            comm,
            coll,
            typed,
            stream,
            input,
            output,
            nccl,
            registered: register,
        })
    }

    /// NCCL's version, when the baseline runs.
    pub fn nccl_version(&self) -> Option<&str> {
        self.nccl.as_ref().map(|n| n.version.as_str())
    }

    fn slices(&self, in_b: usize, out_b: usize) -> Result<(BufferSlice, BufferSlice)> {
        Ok((self.input.slice(..in_b)?, self.output.slice(..out_b)?))
    }

    fn ours(
        &self,
        spec: &Spec,
        input: &BufferSlice,
        output: &BufferSlice,
        count: usize,
    ) -> Result<()> {
        let call = CollectiveCall::new(spec.kind, input, output, count, spec.dtype)
            .op(spec.op)
            .root(spec.root)
            .registered(self.registered);
        self.coll.run(&call, &*self.typed)
    }

    /// Time and host time per call in µs: eager launches, or (`-G N`) replays of a graph of
    /// `N` calls.
    fn time(&self, args: &Args, call: &dyn Fn() -> Result<()>) -> Result<Timed> {
        time_calls_cpu(args, &self.comm, &*self.stream, call)
    }

    /// Measures one size (`size` bytes of the larger buffer); `None` when it holds no element.
    pub fn measure(&self, args: &Args, spec: &Spec, size: usize) -> Result<Option<Measured>> {
        let n = self.comm.nranks();
        let rank = self.comm.rank();
        let per = match spec.kind {
            CollectiveKind::AllReduce | CollectiveKind::Broadcast => 1,
            _ => n,
        };
        let count = size / (spec.dtype.size() * per);
        if count == 0 {
            return Ok(None);
        }
        let (in_e, out_e) = spec.kind.buffer_elements(count as u64, n as u64);
        let (in_b, out_b) = (
            in_e as usize * spec.dtype.size(),
            out_e as usize * spec.dtype.size(),
        );
        let (input, output) = self.slices(in_b, out_b)?;
        let mut data = host_capacity(in_b, "the input's host copy")?;
        for i in 0..in_e as usize {
            spec.dtype
                .encode_f64(f64::from(value(spec, rank, i)), &mut data);
        }
        self.stream.write_from_host(&input, &data)?;
        drop(data);
        let verify = |stream: &dyn Stream| -> Result<u64> {
            if args.check == 0 {
                return Ok(0);
            }
            let mut got = host_bytes(out_b, "the output's host copy")?;
            stream.read_to_host(&mut got, &output)?;
            Ok(check(spec, n, rank, count, &got))
        };
        self.stream.fill(&output, 0xA5)?;
        let zero_copy = self.coll.zero_copy_calls();
        let ours = self.time(args, &|| self.ours(spec, &input, &output, count))?;
        let algo = if self.coll.zero_copy_calls() > zero_copy {
            mscclpp::collectives::AlgorithmId::Read.name()
        } else {
            let block = (count * spec.dtype.size()) as u64;
            self.coll.algorithm(spec.kind, block).name()
        };
        let wrong = verify(&*self.stream)?;
        let nccl = match &self.nccl {
            None => None,
            Some(nc) => {
                let h = self.stream.native_handle().unwrap_or(0);
                self.stream.fill(&output, 0xA5)?;
                self.stream.synchronize()?;
                let t = self.time(args, &|| {
                    nc.run(
                        spec.kind,
                        input.ptr().0,
                        output.ptr().0,
                        count,
                        spec.dtype,
                        spec.op,
                        spec.root,
                        h,
                    )
                })?;
                Some((t, verify(&*self.stream)?))
            }
        };
        // Slowest rank's times, everyone's wrong counts.
        let mut msg = Vec::with_capacity(RESULT_BYTES);
        msg.extend_from_slice(&ours.us.to_le_bytes());
        msg.extend_from_slice(&wrong.to_le_bytes());
        let (nt, nw) = nccl.unwrap_or((Timed::default(), 0));
        msg.extend_from_slice(&nt.us.to_le_bytes());
        msg.extend_from_slice(&nw.to_le_bytes());
        msg.extend_from_slice(&ours.cpu_us.to_le_bytes());
        msg.extend_from_slice(&nt.cpu_us.to_le_bytes());
        let all = self.comm.bootstrap().all_gather(&msg)?;
        let mut m = Measured {
            size: in_b.max(out_b),
            count,
            us: 0.0,
            cpu_us: 0.0,
            wrong: 0,
            nccl: nccl.map(|_| (0.0, 0, 0.0)),
            algo,
        };
        for b in &all {
            if b.len() != RESULT_BYTES {
                return Err(Error::malformed(
                    "perf result",
                    format!("{} bytes instead of {RESULT_BYTES}", b.len()),
                ));
            }
            let f = |k: usize| f64::from_le_bytes(b[k..k + 8].try_into().unwrap_or([0; 8]));
            let u = |k: usize| u64::from_le_bytes(b[k..k + 8].try_into().unwrap_or([0; 8]));
            m.us = m.us.max(f(0));
            m.wrong += u(8);
            m.cpu_us = m.cpu_us.max(f(32));
            if let Some((t, w, c)) = m.nccl.as_mut() {
                *t = t.max(f(16));
                *w += u(24);
                *c = c.max(f(40));
            }
        }
        Ok(Some(m))
    }
}

/// Bytes of one rank's figures of a size: time, wrong, NCCL's time and wrong, host times.
const RESULT_BYTES: usize = 48;

/// What timing a call gives, µs per call.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Timed {
    /// Device time ([`time_calls`]).
    pub us: f64,
    /// Host time spent in the calls (the graph launches under `-G`), divided by the calls.
    pub cpu_us: f64,
}

/// Whether timings are medians of single calls: on the host backend, whose calls are CPU work
/// that the scheduler interrupts (a mean of a few jumped by 10-20 % from size to size).
pub(crate) fn median_timed(comm: &Communicator) -> bool {
    comm.device().info().backend == BackendKind::Host
}

/// What `time(us)` is, for the legend.
pub(crate) fn time_legend(args: &Args, host: bool) -> String {
    let per = if args.cudagraph > 0 {
        format!(
            "per call (graph replays of {} calls, divided)",
            args.cudagraph
        )
    } else {
        "per call".to_string()
    };
    if host {
        format!(
            "time(us): microseconds {per}, the median of {} timed iterations after {} warm-up, the slowest rank's median",
            args.iters, args.warmup
        )
    } else {
        format!(
            "time(us): microseconds {per}, the mean over {} timed iterations after {} warm-up (stream events around them all), the slowest rank's",
            args.iters, args.warmup
        )
    }
}

/// The legend's line about the host backend's figures.
pub(crate) const HOST_LEGEND: &str = "host backend: the CPU reference implementation; its times compare runs on this machine and are no measure of a GPU's or a network's speed";

/// Time per call in µs on `stream`: eager launches, or (`-G N`) replays of a graph of `N` calls
/// (all ranks start together). On the host backend the median of the single launches, else
/// the mean over all of them.
pub(crate) fn time_calls(
    args: &Args,
    comm: &Communicator,
    stream: &dyn Stream,
    call: &dyn Fn() -> Result<()>,
) -> Result<f64> {
    Ok(time_calls_cpu(args, comm, stream, call)?.us)
}

/// [`time_calls`], and the host time the calls took to return (what a caller's thread pays per
/// call; it includes waiting for room in a full launch queue).
pub(crate) fn time_calls_cpu(
    args: &Args,
    comm: &Communicator,
    stream: &dyn Stream,
    call: &dyn Fn() -> Result<()>,
) -> Result<Timed> {
    let device = comm.device();
    let (e0, e1) = (device.create_event()?, device.create_event()?);
    let per_launch = args.cudagraph.max(1) as usize;
    let graph = if args.cudagraph > 0 {
        stream.begin_capture()?;
        let captured = (0..per_launch).try_for_each(|_| call());
        let graph = stream.end_capture();
        captured?;
        Some(graph?)
    } else {
        None
    };
    let run = || match &graph {
        Some(g) => g.launch(&*stream),
        None => call(),
    };
    for _ in 0..args.warmup {
        run()?;
    }
    stream.synchronize()?;
    comm.bootstrap().barrier()?;
    if median_timed(comm) {
        let events = (0..=args.iters)
            .map(|_| device.create_event())
            .collect::<Result<Vec<_>>>()?;
        stream.record(&*events[0])?;
        let mut host = std::time::Duration::ZERO;
        for e in &events[1..] {
            let t = std::time::Instant::now();
            run()?;
            host += t.elapsed();
            stream.record(&**e)?;
        }
        stream.synchronize()?;
        comm.check_live()?;
        let mut us = events
            .windows(2)
            .map(|w| Ok(w[1].elapsed_ms_since(&*w[0])? * 1e3 / per_launch as f64))
            .collect::<Result<Vec<f64>>>()?;
        us.sort_by(f64::total_cmp);
        let mid = us.len() / 2;
        return Ok(Timed {
            us: if us.len() % 2 == 1 {
                us[mid]
            } else {
                (us[mid - 1] + us[mid]) / 2.0
            },
            cpu_us: host.as_secs_f64() * 1e6 / (args.iters * per_launch).max(1) as f64,
        });
    }
    stream.record(&*e0)?;
    let t = std::time::Instant::now();
    for _ in 0..args.iters {
        run()?;
    }
    let host = t.elapsed();
    stream.record(&*e1)?;
    stream.synchronize()?;
    // Kernels of a communicator whose peer died give up their waits and end (GPU kernels on
    // its abort word): a time or a result of those calls is no measurement. The error names the
    // dead rank.
    comm.check_live()?;
    let calls = (args.iters * per_launch).max(1) as f64;
    Ok(Timed {
        us: e1.elapsed_ms_since(&*e0)? * 1e3 / calls,
        cpu_us: host.as_secs_f64() * 1e6 / calls,
    })
}

/// nccl-tests' bus-bandwidth factor.
pub fn bus_factor(kind: CollectiveKind, n: usize) -> f64 {
    let n = n as f64;
    match kind {
        CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => {
            (n - 1.0) / n
        }
        CollectiveKind::Broadcast => 1.0,
    }
}

/// Runs one collective over the sizes; rank 0 prints. Returns the wrong elements (ours and the
/// baseline's) over all ranks.
pub fn run(args: &Args, comm: Arc<Communicator>, kind: CollectiveKind) -> Result<u64> {
    if !args.typed {
        return run_on::<Dyn>(args, comm, kind);
    }
    match comm.device().info().backend {
        BackendKind::Host => run_on::<mscclpp::host::Host>(args, comm, kind),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => run_on::<mscclpp::cuda::Cuda>(args, comm, kind),
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => run_on::<mscclpp::rocm::Rocm>(args, comm, kind),
        #[allow(unreachable_patterns)]
        other => Err(Error::unavailable(
            "--typed",
            format!("the {other} backend is not built into this binary"),
        )),
    }
}

/// [`run`] with our collectives over backend `A` (`Dyn`: the trait objects).
fn run_on<A: Api>(args: &Args, comm: Arc<Communicator>, kind: CollectiveKind) -> Result<u64> {
    let dtype: DataType = args.datatype.parse()?;
    let op: ReduceOp = args.op.parse()?;
    let sizes = args.sizes();
    let max = sizes.last().copied().unwrap_or(0);
    let bench = Bench::<A>::new(comm.clone(), max, args.baseline.is_some(), args.register)?;
    let spec = Spec {
        kind,
        dtype,
        op,
        root: args.root,
    };
    let info = comm.device().info();
    let nranks = comm.nranks();
    let factor = bus_factor(kind, nranks);
    let mut table = Table::new(args.json, comm.rank() == 0, bench.nccl.is_some())
        .with_algo()
        .with_cpu();
    // Only what applies: the operator of reductions, the root of broadcasts.
    let mut what = format!("{dtype}");
    if kind.reduces() {
        what += &format!(", op {op}");
    }
    if kind == CollectiveKind::Broadcast {
        what += &format!(", root {}", args.root);
    }
    let title = format!(
        "mscclpp-perf {}: {nranks} ranks on the {} backend ({}), {what}, {}, {} iterations after {} warm-up{}{}",
        kind.name(),
        info.backend,
        info.name,
        args.timing(),
        args.iters,
        args.warmup,
        match (args.register, args.typed) {
            (true, true) =>
                "; our buffers registered; our collectives over the backend's own types",
            (true, false) => "; our buffers registered",
            (false, true) => "; our collectives over the backend's own types",
            (false, false) => "",
        },
        bench.nccl_version().map_or(String::new(), |v| format!(
            "; baseline NCCL {v} on the same buffers and stream"
        ))
    );
    table.preamble(
        &title,
        &Meta {
            bench: kind.name(),
            backend: info.backend.to_string(),
            device: info.name.clone(),
            nranks,
            timing: args.timing(),
        },
    );
    let host = median_timed(&comm);
    let mut legend = vec![
        time_legend(args, host),
        "cpu(us): host microseconds per call spent in the calls (the caller's thread: argument checks, launch, queueing; with -G the graph launches), the slowest rank's; a full launch queue makes the caller wait, so it is the host's cost only where it is below time(us)".to_string(),
        format!(
            "algbw = size / time (GB/s = 1e9 B/s; size: bytes of the larger buffer of one rank); busbw = algbw x {factor:.3} ({}, nccl-tests' bus bandwidth, comparable across rank counts)",
            match kind {
                CollectiveKind::AllReduce => "2(n-1)/n",
                CollectiveKind::Broadcast => "1",
                _ => "(n-1)/n",
            }
        ),
        "algo: the algorithm our library chose for the size (ll, ll-short, ll128: packets through scratch; direct: pipelined stores; read: peers' inputs read in place; ce: copy engines; hier: across hosts); #wrong: output elements that differ from the expected values, all ranks".to_string(),
    ];
    if bench.nccl.is_some() {
        legend.push(
            "nccl(us), algbw, busbw: NCCL's on the same buffers and stream; speedup = NCCL's time / ours".into(),
        );
    }
    if host {
        legend.push(HOST_LEGEND.into());
    }
    table.legend(&legend);
    table.header();
    // One untimed pass over the first size: the first calls of a process pay for module loading,
    // first-touch mappings and clock ramp-up, which short warm-ups left in the first row.
    if let Some(&first) = sizes.first() {
        if let Some(m) = bench.measure(args, &spec, first)? {
            table.count_wrong(m.wrong + m.nccl.map_or(0, |(_, w, _)| w));
        }
    }
    for size in sizes {
        let Some(m) = bench.measure(args, &spec, size)? else {
            continue;
        };
        let alg = |us: f64| m.size as f64 / us / 1e3;
        table.row(&Row {
            bench: kind.name(),
            bytes: m.size,
            count: m.count,
            dtype: dtype.name(),
            // nccl-tests' words for what does not apply.
            op: if kind.reduces() { op.name() } else { "none" },
            root: (kind == CollectiveKind::Broadcast).then_some(args.root),
            nranks,
            time_us: m.us,
            cpu_us: Some(m.cpu_us),
            algbw_gbps: alg(m.us),
            busbw_gbps: alg(m.us) * factor,
            wrong: (args.check != 0).then_some(m.wrong),
            baseline: m.nccl.map(|(t, w, c)| Baseline {
                time_us: t,
                cpu_us: Some(c),
                algbw_gbps: alg(t),
                busbw_gbps: alg(t) * factor,
                wrong: w,
            }),
            algo: Some(m.algo),
        });
    }
    table.footer();
    Ok(table.wrong_total())
}
