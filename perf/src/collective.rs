//! Collective benchmarks: our collectives beside NCCL (`--baseline nccl`), same buffers, same
//! stream, same run; every result checked against exactly representable expected values.

use std::sync::Arc;

use mscclpp::collectives::{CollectiveCall, CollectiveKind, Collectives};
use mscclpp::comm::Communicator;
use mscclpp::hal::{
    BufferSlice, DataType, DeviceBuffer, Error, MemoryKind, ReduceOp, Result, Stream,
};

use crate::args::Args;
use crate::nccl::Nccl;
use crate::report::{Baseline, Row, Table};

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
    /// Our wrong elements, all ranks.
    pub wrong: u64,
    /// NCCL's time and wrong elements, when measured.
    pub nccl: Option<(f64, u64)>,
}

/// The collective benchmark of one rank.
pub struct Bench {
    comm: Arc<Communicator>,
    coll: Collectives,
    stream: Arc<dyn Stream>,
    input: DeviceBuffer,
    output: DeviceBuffer,
    nccl: Option<Nccl>,
    /// The input is registered on every rank (`--register`): all-reduces may read it in place.
    registered: bool,
}

impl Bench {
    /// Sets up buffers of `max` bytes, the collectives and (optionally) NCCL.
    pub fn new(
        comm: Arc<Communicator>,
        max: usize,
        baseline: bool,
        register: bool,
    ) -> Result<Bench> {
        let device = comm.device().clone();
        let coll = Collectives::new(comm.clone())?;
        let stream = device.create_stream()?;
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
        self.coll.run(&call, &*self.stream)
    }

    /// Time per call in µs: eager launches, or (`-G N`) replays of a graph of `N` calls.
    fn time(&self, args: &Args, call: &dyn Fn() -> Result<()>) -> Result<f64> {
        time_calls(args, &self.comm, &*self.stream, call)
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
        let mut data = Vec::with_capacity(in_b);
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
            let mut got = vec![0u8; out_b];
            stream.read_to_host(&mut got, &output)?;
            Ok(check(spec, n, rank, count, &got))
        };
        self.stream.fill(&output, 0xA5)?;
        let us = self.time(args, &|| self.ours(spec, &input, &output, count))?;
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
        let mut msg = Vec::with_capacity(32);
        msg.extend_from_slice(&us.to_le_bytes());
        msg.extend_from_slice(&wrong.to_le_bytes());
        let (nt, nw) = nccl.unwrap_or((0.0, 0));
        msg.extend_from_slice(&nt.to_le_bytes());
        msg.extend_from_slice(&nw.to_le_bytes());
        let all = self.comm.bootstrap().all_gather(&msg)?;
        let mut m = Measured {
            size: in_b.max(out_b),
            count,
            us: 0.0,
            wrong: 0,
            nccl: nccl.map(|_| (0.0, 0)),
        };
        for b in &all {
            if b.len() != 32 {
                return Err(Error::malformed(
                    "perf result",
                    format!("{} bytes instead of 32", b.len()),
                ));
            }
            let f = |k: usize| f64::from_le_bytes(b[k..k + 8].try_into().unwrap_or([0; 8]));
            let u = |k: usize| u64::from_le_bytes(b[k..k + 8].try_into().unwrap_or([0; 8]));
            m.us = m.us.max(f(0));
            m.wrong += u(8);
            if let Some((t, w)) = m.nccl.as_mut() {
                *t = t.max(f(16));
                *w += u(24);
            }
        }
        Ok(Some(m))
    }
}

/// Time per call in µs on `stream`: eager launches, or (`-G N`) replays of a graph of `N` calls
/// (all ranks start together).
pub(crate) fn time_calls(
    args: &Args,
    comm: &Communicator,
    stream: &dyn Stream,
    call: &dyn Fn() -> Result<()>,
) -> Result<f64> {
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
    stream.record(&*e0)?;
    for _ in 0..args.iters {
        run()?;
    }
    stream.record(&*e1)?;
    stream.synchronize()?;
    // Kernels of a communicator whose peer died give up their waits and end (GPU kernels on
    // its abort word): a time or a result of those calls is no measurement. The error names the
    // dead rank.
    comm.check_live()?;
    Ok(e1.elapsed_ms_since(&*e0)? * 1e3 / (args.iters * per_launch) as f64)
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
    let dtype: DataType = args.datatype.parse()?;
    let op: ReduceOp = args.op.parse()?;
    let sizes = args.sizes();
    let max = sizes.last().copied().unwrap_or(0);
    let bench = Bench::new(comm.clone(), max, args.baseline.is_some(), args.register)?;
    let spec = Spec {
        kind,
        dtype,
        op,
        root: args.root,
    };
    let info = comm.device().info();
    let nranks = comm.nranks();
    let factor = bus_factor(kind, nranks);
    let mut table = Table::new(args.json, comm.rank() == 0, bench.nccl.is_some());
    table.comment(&format!(
        "mscclpp-perf {}: {nranks} ranks on the {} backend ({}), {dtype}, op {op}, root {}, {}, {} iterations after {} warm-up{}{}",
        kind.name(),
        info.backend,
        info.name,
        args.root,
        args.timing(),
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
    ));
    table.header();
    // One untimed pass over the first size: the first calls of a process pay for module loading,
    // first-touch mappings and clock ramp-up, which short warm-ups left in the first row.
    if let Some(&first) = sizes.first() {
        if let Some(m) = bench.measure(args, &spec, first)? {
            table.count_wrong(m.wrong + m.nccl.map_or(0, |(_, w)| w));
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
            op: op.name(),
            root: Some(args.root),
            nranks,
            time_us: m.us,
            algbw_gbps: alg(m.us),
            busbw_gbps: alg(m.us) * factor,
            wrong: (args.check != 0).then_some(m.wrong),
            baseline: m.nccl.map(|(t, w)| Baseline {
                time_us: t,
                algbw_gbps: alg(t),
                busbw_gbps: alg(t) * factor,
                wrong: w,
            }),
        });
    }
    table.footer();
    Ok(table.wrong_total())
}
