//! Collectives against a CPU reference, on the host backend with ranks as separate processes:
//! every collective × data type (the 12 of NCCL 2.28: 8-, 16-, 32- and 64-bit, FP8) × operator,
//! odd counts, messages that take many rounds, in place and out of place, outputs poisoned first
//! (and the bytes past the end checked untouched).
//! 2, 3, 4 and 8 ranks. Runs with `cargo test -p mscclpp-conformance --test collectives`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::{Completion, Failed, Trial};
use mscclpp::collectives::{
    AlgorithmId, CollectiveCall, CollectiveKind, Collectives, DEFAULT_SLOT_BYTES,
};
use mscclpp::comm::Communicator;
use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use mscclpp::hal::{
    Api, BackendKind, DataType, DeviceApi, ErrorClass, GraphApi, MemoryKind, ReduceOp, StreamApi,
};
use mscclpp::typed;
use mscclpp_conformance::multiproc;
use mscclpp_conformance::reference::{count_wrong, expected, random_input};
use mscclpp_conformance::rng::Rng;

const UID_VAR: &str = "MSCCLPP_TEST_UID";
const BACKEND_VAR: &str = "MSCCLPP_TEST_BACKEND";
const GUARD: usize = 64;
const POISON: u8 = 0xA5;

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

fn seed(case: usize, rank: usize) -> u64 {
    0x5eed_0000_0000 ^ ((case as u64) << 8) ^ rank as u64
}

/// One rank's whole matrix.
fn role_matrix() -> R<()> {
    // GPUs: ranks share the devices there are (4 ranks on 2 GPUs, 2 per GPU).
    let (comm, device, kind) = multiproc::rank_communicator(UID_VAR, BACKEND_VAR, false)?;
    let slot: u64 = std::env::var("MSCCLPP_TEST_SLOT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let counts: Vec<usize> = std::env::var("MSCCLPP_TEST_COUNTS")
        .map_err(e)?
        .split(',')
        .filter_map(|c| c.parse().ok())
        .collect();
    // The collectives and the stream over the backend's own types (`mscclpp::hal::api`), the
    // launch path static down to the vendor.
    match kind {
        BackendKind::Host => matrix::<mscclpp::host::Host>(comm, device, slot, counts),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => matrix::<mscclpp::cuda::Cuda>(comm, device, slot, counts),
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => matrix::<mscclpp::rocm::Rocm>(comm, device, slot, counts),
        #[allow(unreachable_patterns)]
        other => Err(format!("the {other} backend is not built in")),
    }
}

fn matrix<A: Api>(
    comm: Arc<Communicator>,
    device: Arc<dyn mscclpp::hal::Device>,
    slot: u64,
    counts: Vec<usize>,
) -> R<()> {
    let (rank, n) = (comm.rank(), comm.nranks());
    let coll = Collectives::<A>::on_backend(comm.clone(), slot).map_err(e)?;
    // MSCCLPP_TEST_SHORT_ODD_OFF=1: odd ranks keep one-round calls on the general LL kernel while
    // even ranks take the short kernels (the two must interoperate).
    if rank % 2 == 1 && std::env::var("MSCCLPP_TEST_SHORT_ODD_OFF").is_ok_and(|v| v == "1") {
        coll.use_short_kernels(false);
    }
    let typed = A::device_of(&device).map_err(e)?;
    let stream = DeviceApi::create_stream(&*typed).map_err(e)?;
    let mut first_calls = 0;
    if std::env::var("MSCCLPP_TEST_ALGO").is_ok_and(|v| v == "ce") {
        first_calls = ce_first_call_captured(&coll, &device, &*stream, rank, n)?;
    }
    let max_elems = counts.iter().max().copied().unwrap_or(1) * n;
    let inbuf = device
        .alloc(max_elems * 8 + GUARD, MemoryKind::Device)
        .map_err(e)?;
    let outbuf = device
        .alloc(max_elems * 8 + GUARD, MemoryKind::Device)
        .map_err(e)?;

    // Registered buffers (MSCCLPP_TEST_REGISTER=1): every rank registers its output buffer, so
    // that in-place all-reduces read the peers' inputs where they are; even ranks also register
    // their input buffer (odd ranks a spare one in the same step), so that out-of-place calls
    // mix read-in-place ranks with staging ones.
    let spare = device.alloc(4096, MemoryKind::Device).map_err(e)?;
    let windows = if std::env::var("MSCCLPP_TEST_REGISTER").is_ok_and(|v| v == "1") {
        let w_out = coll.register(&outbuf.full()).map_err(e)?;
        let second = if rank % 2 == 0 { &inbuf } else { &spare };
        let w_in = coll.register(&second.full()).map_err(e)?;
        if w_out == w_in {
            return Err(format!("two registrations got one window {w_out:?}"));
        }
        vec![w_out, w_in]
    } else {
        Vec::new()
    };
    let kinds: Vec<CollectiveKind> = match std::env::var("MSCCLPP_TEST_KINDS") {
        Ok(v) => CollectiveKind::ALL
            .into_iter()
            .filter(|k| v.split(',').any(|n| n == k.name()))
            .collect(),
        Err(_) => CollectiveKind::ALL.to_vec(),
    };

    // MSCCLPP_TEST_DTYPES: a comma list of type names (default: every type).
    let dtypes: Vec<DataType> = match std::env::var("MSCCLPP_TEST_DTYPES") {
        Ok(v) => v
            .split(',')
            .map(|d| d.parse::<DataType>().map_err(e))
            .collect::<R<_>>()?,
        Err(_) => DataType::ALL.to_vec(),
    };

    let mut case = 0usize;
    let (mut calls, mut wrong_total) = (first_calls, 0usize);
    let t = Instant::now();
    for kind in kinds {
        for &dtype in &dtypes {
            let ops: &[ReduceOp] = if kind.reduces() {
                &ReduceOp::ALL
            } else {
                &[ReduceOp::Sum]
            };
            for &op in ops {
                for &count in &counts {
                    let roots: Vec<usize> = if kind == CollectiveKind::Broadcast {
                        vec![0, n - 1]
                    } else {
                        vec![0]
                    };
                    for root in roots {
                        for in_place in [false, true] {
                            case += 1;
                            let (in_e, out_e) = kind.buffer_elements(count as u64, n as u64);
                            let (in_b, out_b) =
                                (in_e as usize * dtype.size(), out_e as usize * dtype.size());
                            let inputs: Vec<Vec<u8>> = (0..n)
                                .map(|r| {
                                    random_input(dtype, in_e as usize, &mut Rng::new(seed(case, r)))
                                })
                                .collect();
                            let want = expected(kind, dtype, op, &inputs, rank, count, root);
                            // Lay the buffers out; in place the input lives inside the output.
                            stream.fill(&outbuf.full(), POISON).map_err(e)?;
                            stream.fill(&inbuf.full(), 0x5A).map_err(e)?;
                            let slice =
                                |b: &mscclpp::hal::DeviceBuffer, r: std::ops::Range<usize>| {
                                    b.slice(r).map_err(e)
                                };
                            let (input, output) = match (in_place, kind) {
                                (false, _) => (slice(&inbuf, 0..in_b)?, slice(&outbuf, 0..out_b)?),
                                (true, CollectiveKind::AllGather) => (
                                    slice(&outbuf, rank * in_b..(rank + 1) * in_b)?,
                                    slice(&outbuf, 0..out_b)?,
                                ),
                                (true, CollectiveKind::ReduceScatter) => (
                                    slice(&inbuf, 0..in_b)?,
                                    slice(&inbuf, rank * out_b..(rank + 1) * out_b)?,
                                ),
                                (true, _) => (slice(&outbuf, 0..in_b)?, slice(&outbuf, 0..out_b)?),
                            };
                            stream.write_from_host(&input, &inputs[rank]).map_err(e)?;
                            let call = CollectiveCall::new(kind, &input, &output, count, dtype)
                                .op(op)
                                .root(root);
                            let r = coll.run(&call, &*stream);
                            r.map_err(|x| {
                                format!(
                                    "case {case} ({} {dtype} {op} count {count}): {x}",
                                    kind.name()
                                )
                            })?;
                            stream
                                .synchronize_timeout(Duration::from_secs(60))
                                .map_err(|x| format!("case {case}: {x}"))?;
                            calls += 1;
                            let mut got = vec![0u8; out_b];
                            stream.read_to_host(&mut got, &output).map_err(e)?;
                            let wrong = count_wrong(dtype, op, &got, &want);
                            // Bytes past the output untouched (out of place: the guard region).
                            if !in_place {
                                let mut guard = vec![0u8; GUARD];
                                stream
                                    .read_to_host(
                                        &mut guard,
                                        &outbuf.slice(out_b..out_b + GUARD).map_err(e)?,
                                    )
                                    .map_err(e)?;
                                if guard.iter().any(|&b| b != POISON) {
                                    return Err(format!(
                                        "case {case} ({} {dtype} count {count}): wrote past the output",
                                        kind.name()
                                    ));
                                }
                            }
                            if wrong > 0 {
                                eprintln!(
                                    "rank {rank}: case {case} {} {dtype} {op} count {count} root {root} in_place {in_place}: {wrong} wrong",
                                    kind.name()
                                );
                            }
                            wrong_total += wrong;
                            // Nobody starts the next case (and refills buffers a peer may still
                            // read through a kernel) before everyone has finished this one.
                            comm.bootstrap().barrier().map_err(e)?;
                        }
                    }
                }
            }
        }
    }
    // Bad arguments are errors, not wrong answers.
    let small = inbuf.slice(..4).map_err(e)?;
    let err = coll
        .all_reduce(&small, &small, 2, DataType::F32, ReduceOp::Sum, &*stream)
        .err()
        .ok_or("too-small buffer accepted")?;
    if err.class() != ErrorClass::InvalidUsage || !err.to_string().contains("too small") {
        return Err(format!("unclear error: {err}"));
    }
    let whole = inbuf.slice(..8 * n).map_err(e)?;
    let shifted = inbuf.slice(4..4 + 4 * n).map_err(e)?;
    if coll
        .all_to_all(&whole, &shifted, 1, DataType::F32, &*stream)
        .is_ok()
    {
        return Err("all-to-all with partly overlapping buffers accepted".into());
    }
    if coll
        .broadcast(&whole, &whole, 1, DataType::F32, n, &*stream)
        .is_ok()
    {
        return Err("broadcast root out of range accepted".into());
    }
    if coll
        .all_reduce(
            &whole,
            &whole,
            usize::MAX / 2,
            DataType::F32,
            ReduceOp::Sum,
            &*stream,
        )
        .is_ok()
    {
        return Err("overflowing count accepted".into());
    }
    for w in windows {
        coll.deregister(w).map_err(e)?;
        if coll.deregister(w).is_ok() {
            return Err(format!("window {w:?} deregistered twice"));
        }
    }
    // MSCCLPP_TEST_ALGO=ce: the matrix's kinds took the copy-engine algorithm, and it also holds
    // for calls back to back with no synchronisation and for replays of a captured graph.
    if std::env::var("MSCCLPP_TEST_ALGO").is_ok_and(|v| v == "ce") {
        for kind in CollectiveKind::ALL {
            for bytes in [0, 1, 1 << 20, 1 << 30] {
                let id = coll.algorithm(kind, bytes);
                if id != AlgorithmId::Ce {
                    return Err(format!("{} of {bytes} B took {id}, not ce", kind.name()));
                }
            }
        }
        let (c, w) = ce_burst(&coll, &device, &*stream, rank, n)?;
        calls += c;
        wrong_total += w;
    }
    // MSCCLPP_TEST_ALGO=ce_by_size (with MSCCLPP_CE_AUTO_BYTES=4096): the choice by size takes
    // the copy engines from the threshold on, and only there.
    if std::env::var("MSCCLPP_TEST_ALGO").is_ok_and(|v| v == "ce_by_size") {
        for kind in CollectiveKind::ALL {
            for (bytes, want_ce) in [(4095, false), (4096, true), (1 << 30, true)] {
                let id = coll.algorithm(kind, bytes);
                if (id == AlgorithmId::Ce) != want_ce {
                    return Err(format!("{} of {bytes} B per rank took {id}", kind.name()));
                }
            }
        }
    }
    multiproc::report("calls", calls);
    multiproc::report("wrong", wrong_total);
    multiproc::report("seconds", format!("{:.1}", t.elapsed().as_secs_f64()));
    comm.bootstrap().barrier().map_err(e)?;
    Ok(())
}

/// The copy engines forced for all-reduce: the communicator's very first all-reduce may be
/// captured in a graph (its gather buffer was allocated at set-up), and the graph's replays are
/// right. Returns the calls made.
fn ce_first_call_captured<A: Api>(
    coll: &Collectives<A>,
    device: &Arc<dyn mscclpp::hal::Device>,
    stream: &A::Stream,
    rank: usize,
    n: usize,
) -> R<usize> {
    const COUNT: usize = 1001;
    let input = device.alloc(COUNT, MemoryKind::Device).map_err(e)?;
    let output = device.alloc(COUNT, MemoryKind::Device).map_err(e)?;
    let (inp, out) = (input.full(), output.full());
    let call = CollectiveCall::new(CollectiveKind::AllReduce, &inp, &out, COUNT, DataType::U8);
    match stream.begin_capture() {
        Ok(()) => {}
        Err(x) if x.class() == ErrorClass::Unavailable => {
            eprintln!("rank {rank}: ce first call captured: skipped: {x}");
            return Ok(0);
        }
        Err(x) => return Err(format!("begin_capture: {x}")),
    }
    let r = coll.run(&call, stream);
    let graph = stream.end_capture().map_err(e)?;
    r.map_err(|x| format!("the first all-reduce by the copy engines, captured: {x}"))?;
    let want: u8 = (1..=n as u8).fold(0, u8::wrapping_add);
    for replay in 0..2 {
        stream.fill(&inp, rank as u8 + 1).map_err(e)?;
        stream.fill(&out, POISON).map_err(e)?;
        graph.launch(stream).map_err(e)?;
        stream
            .synchronize_timeout(Duration::from_secs(60))
            .map_err(|x| format!("ce first call captured, replay {replay}: {x}"))?;
        let mut got = vec![0u8; COUNT];
        stream.read_to_host(&mut got, &out).map_err(e)?;
        let wrong = got.iter().filter(|&&b| b != want).count();
        if wrong > 0 {
            return Err(format!(
                "ce first call captured, replay {replay}: {wrong} of {COUNT} bytes wrong"
            ));
        }
    }
    Ok(2)
}

/// Byte of input block `q` of rank `p` in burst call `i`.
fn burst_byte(i: usize, p: usize, q: usize) -> u8 {
    ((i * 31 + p * 7 + q * 3) % 251) as u8 + 1
}

/// Copy-engine calls back to back on one stream with no synchronisation (all-gather, broadcast
/// from every root, all-to-all, reduce-scatter, all-reduce, each into its own output slice,
/// inputs refilled on the stream between calls), then the first five captured in a graph and
/// replayed into poisoned outputs. Returns (calls, wrong bytes).
fn ce_burst<A: Api>(
    coll: &Collectives<A>,
    device: &Arc<dyn mscclpp::hal::Device>,
    stream: &A::Stream,
    rank: usize,
    n: usize,
) -> R<(usize, usize)> {
    use CollectiveKind::*;
    // Odd, and several chunks of a 4 KiB scratch.
    const COUNT: usize = 9001;
    let plan: Vec<(CollectiveKind, usize)> = (0..20)
        .map(|i| match i % 5 {
            0 => (AllGather, 0),
            1 => (Broadcast, i % n),
            2 => (AllToAll, 0),
            3 => (ReduceScatter, 0),
            _ => (AllReduce, 0),
        })
        .collect();
    let input = device.alloc(n * COUNT, MemoryKind::Device).map_err(e)?;
    let outs = device
        .alloc(plan.len() * n * COUNT, MemoryKind::Device)
        .map_err(e)?;
    let out_of = |i: usize| outs.slice(i * n * COUNT..(i + 1) * n * COUNT).map_err(e);
    let fill_input = |i: usize| -> R<()> {
        for q in 0..n {
            let block = input.slice(q * COUNT..(q + 1) * COUNT).map_err(e)?;
            stream.fill(&block, burst_byte(i, rank, q)).map_err(e)?;
        }
        Ok(())
    };
    let enqueue = |i: usize, kind: CollectiveKind, root: usize| -> R<()> {
        fill_input(i)?;
        let out = out_of(i)?;
        let (in_e, out_e) = kind.buffer_elements(COUNT as u64, n as u64);
        let inp = input.slice(..in_e as usize).map_err(e)?;
        let out = out.slice(..out_e as usize).map_err(e)?;
        let call = CollectiveCall::new(kind, &inp, &out, COUNT, DataType::U8).root(root);
        coll.run(&call, stream)
            .map_err(|x| format!("burst call {i}: {x}"))
    };
    let check = |i: usize, kind: CollectiveKind, root: usize| -> R<usize> {
        let mut got = vec![0u8; n * COUNT];
        stream.read_to_host(&mut got, &out_of(i)?).map_err(e)?;
        let want = |at: usize| -> u8 {
            let (p, _) = (at / COUNT, at % COUNT);
            match kind {
                AllGather => burst_byte(i, p, 0),
                Broadcast if at < COUNT => burst_byte(i, root, 0),
                AllToAll => burst_byte(i, p, rank),
                // u8 sums wrap.
                ReduceScatter if at < COUNT => (0..n)
                    .map(|q| burst_byte(i, q, rank))
                    .fold(0u8, u8::wrapping_add),
                // The input is filled block by block (`COUNT` bytes each): element `at` of an
                // all-reduce lies in input block 0.
                AllReduce if at < COUNT => (0..n)
                    .map(|q| burst_byte(i, q, 0))
                    .fold(0u8, u8::wrapping_add),
                _ => POISON,
            }
        };
        let wrong = got
            .iter()
            .enumerate()
            .filter(|&(at, &b)| b != want(at))
            .count();
        if wrong > 0 {
            eprintln!(
                "rank {rank}: ce burst call {i} ({}, root {root}): {wrong} wrong",
                kind.name()
            );
        }
        Ok(wrong)
    };
    stream.fill(&outs.full(), POISON).map_err(e)?;
    for (i, &(kind, root)) in plan.iter().enumerate() {
        enqueue(i, kind, root)?;
    }
    stream
        .synchronize_timeout(Duration::from_secs(60))
        .map_err(|x| format!("ce burst: {x}"))?;
    let mut wrong = 0;
    for (i, &(kind, root)) in plan.iter().enumerate() {
        wrong += check(i, kind, root)?;
    }
    let mut calls = plan.len();
    // A graph of five calls (one of each kind), replayed twice into poisoned outputs.
    match stream.begin_capture() {
        Ok(()) => {
            for (i, &(kind, root)) in plan.iter().enumerate().take(5) {
                enqueue(i, kind, root)?;
            }
            let graph = stream.end_capture().map_err(e)?;
            for _ in 0..2 {
                stream.fill(&outs.full(), POISON).map_err(e)?;
                graph.launch(stream).map_err(e)?;
                stream
                    .synchronize_timeout(Duration::from_secs(60))
                    .map_err(|x| format!("ce graph replay: {x}"))?;
                for (i, &(kind, root)) in plan.iter().enumerate().take(5) {
                    wrong += check(i, kind, root)?;
                }
                calls += 5;
            }
        }
        Err(x) if x.class() == ErrorClass::Unavailable => {
            eprintln!("rank {rank}: ce graph replay skipped: {x}");
        }
        Err(x) => return Err(format!("begin_capture: {x}")),
    }
    // The per-call setting: asking for the copy engines takes them.
    stream.fill(&outs.full(), POISON).map_err(e)?;
    fill_input(0)?;
    let ag_out = outs.slice(..n * COUNT).map_err(e)?;
    let ag_in = input.slice(..COUNT).map_err(e)?;
    let ag = CollectiveCall::new(AllGather, &ag_in, &ag_out, COUNT, DataType::U8)
        .algorithm(Some(AlgorithmId::Ce));
    coll.run(&ag, stream)
        .map_err(|x| format!("all-gather asking for ce: {x}"))?;
    stream
        .synchronize_timeout(Duration::from_secs(60))
        .map_err(|x| format!("ce per-call all-gather: {x}"))?;
    wrong += check(0, AllGather, 0)?;
    fill_input(4)?;
    let ar_io = (input.slice(..COUNT).map_err(e)?, out_of(4)?);
    let ar_out = ar_io.1.slice(..COUNT).map_err(e)?;
    let ar = CollectiveCall::new(AllReduce, &ar_io.0, &ar_out, COUNT, DataType::U8)
        .algorithm(Some(AlgorithmId::Ce));
    coll.run(&ar, stream)
        .map_err(|x| format!("all-reduce asking for ce: {x}"))?;
    stream
        .synchronize_timeout(Duration::from_secs(60))
        .map_err(|x| format!("ce per-call all-reduce: {x}"))?;
    wrong += check(4, AllReduce, 0)?;
    calls += 2;
    Ok((calls, wrong))
}

/// One rank's calls on two streams: a mix of collectives and point-to-point rings, each on the
/// other stream than the last, with no synchronisation between them (PyTorch's FSDP2 issues one
/// process group's all-gathers and reduce-scatters on different streams). The communicator
/// must order them as NCCL does; overlapping calls would share flags and scratch.
fn role_streams() -> R<()> {
    use mscclpp::collectives::{P2pKind, P2pOp};
    let (rank, n) = multiproc::rank_and_size();
    let uid: UniqueId = std::env::var(UID_VAR).map_err(e)?.parse().map_err(e)?;
    let boot = Arc::new(
        Bootstrap::new(&uid, rank, n, BootstrapConfig::from_env().map_err(e)?).map_err(e)?,
    );
    let kind: BackendKind = std::env::var(BACKEND_VAR).map_err(e)?.parse().map_err(e)?;
    let backend = mscclpp::registry::probe(kind).map_err(e)?;
    let ordinal = match kind {
        BackendKind::Host => rank,
        _ => rank % backend.device_count().max(1),
    };
    let device = backend.open_device(ordinal).map_err(e)?;
    let comm = Arc::new(Communicator::new(boot, device.clone()));
    let coll = typed::collectives(comm.clone(), DEFAULT_SLOT_BYTES).map_err(e)?;
    let streams = [
        device.create_stream().map_err(e)?,
        device.create_stream().map_err(e)?,
    ];
    let dtype = DataType::F32;
    // (kind, count): LL-sized and larger calls, so that several algorithms take part.
    let kinds = [
        (CollectiveKind::AllReduce, 1000),
        (CollectiveKind::AllGather, 777),
        (CollectiveKind::ReduceScatter, 4097),
        (CollectiveKind::AllReduce, 300_001),
        (CollectiveKind::AllReduce, 33),
        (CollectiveKind::AllGather, 65_537),
    ];
    let rounds = 4;
    struct Call {
        kind: Option<CollectiveKind>,
        count: usize,
        input: mscclpp::hal::DeviceBuffer,
        output: mscclpp::hal::DeviceBuffer,
        want: Vec<u8>,
    }
    let mut calls = Vec::new();
    let setup = &streams[0];
    for round in 0..rounds {
        for (i, &(kind, count)) in kinds.iter().enumerate() {
            let case = 10_000 + round * 100 + i;
            let (in_e, out_e) = kind.buffer_elements(count as u64, n as u64);
            let inputs: Vec<Vec<u8>> = (0..n)
                .map(|r| random_input(dtype, in_e as usize, &mut Rng::new(seed(case, r))))
                .collect();
            let want = expected(kind, dtype, ReduceOp::Sum, &inputs, rank, count, 0);
            let input = device
                .alloc(in_e as usize * 4, MemoryKind::Device)
                .map_err(e)?;
            let output = device
                .alloc(out_e as usize * 4, MemoryKind::Device)
                .map_err(e)?;
            setup
                .write_from_host(&input.full(), &inputs[rank])
                .map_err(e)?;
            setup.fill(&output.full(), POISON).map_err(e)?;
            calls.push(Call {
                kind: Some(kind),
                count,
                input,
                output,
                want,
            });
        }
        // A ring of sends and receives between the collectives.
        let bytes = 3000 + round * 8;
        let msg = |src: usize| p2p_msg(77, src, (src + 1) % n, round, bytes);
        let input = device.alloc(bytes, MemoryKind::Device).map_err(e)?;
        let output = device.alloc(bytes, MemoryKind::Device).map_err(e)?;
        setup
            .write_from_host(&input.full(), &msg(rank))
            .map_err(e)?;
        setup.fill(&output.full(), POISON).map_err(e)?;
        calls.push(Call {
            kind: None,
            count: bytes,
            input,
            output,
            want: msg((rank + n - 1) % n),
        });
    }
    setup
        .synchronize_timeout(Duration::from_secs(60))
        .map_err(e)?;
    comm.bootstrap().barrier().map_err(e)?;
    for (i, c) in calls.iter().enumerate() {
        let stream = &*streams[i % 2];
        let what =
            |x: mscclpp::hal::Error| format!("call {i} ({:?} count {}): {x}", c.kind, c.count);
        match c.kind {
            Some(kind) => {
                let (input, output) = (c.input.full(), c.output.full());
                let call = CollectiveCall::new(kind, &input, &output, c.count, dtype);
                coll.run(&call, stream).map_err(what)?;
            }
            None => {
                let (send, recv) = (c.input.full(), c.output.full());
                let ops = [
                    P2pOp {
                        kind: P2pKind::Send,
                        peer: (rank + 1) % n,
                        buffer: &send,
                        bytes: c.count,
                    },
                    P2pOp {
                        kind: P2pKind::Recv,
                        peer: (rank + n - 1) % n,
                        buffer: &recv,
                        bytes: c.count,
                    },
                ];
                coll.send_recv(&ops, stream).map_err(what)?;
            }
        }
    }
    for s in &streams {
        s.synchronize_timeout(Duration::from_secs(120)).map_err(e)?;
    }
    let mut wrong = 0;
    for (i, c) in calls.iter().enumerate() {
        let mut got = vec![0u8; c.want.len()];
        streams[0]
            .read_to_host(&mut got, &c.output.full())
            .map_err(e)?;
        let w = match c.kind {
            Some(_) => count_wrong(dtype, ReduceOp::Sum, &got, &c.want),
            None => got.iter().zip(&c.want).filter(|(a, b)| a != b).count(),
        };
        if w > 0 {
            eprintln!(
                "rank {rank}: call {i} ({:?} count {}): {w} wrong",
                c.kind, c.count
            );
        }
        wrong += w;
    }
    multiproc::report("calls", calls.len());
    multiproc::report("wrong", wrong);
    multiproc::report("seconds", "0");
    comm.bootstrap().barrier().map_err(e)?;
    Ok(())
}

/// The bytes rank `src` sends to rank `dst` as its message `k` of pattern `pat`.
fn p2p_msg(pat: u64, src: usize, dst: usize, k: usize, bytes: usize) -> Vec<u8> {
    let mut r = Rng::new(seed(pat as usize * 64 + k, src * 8 + dst));
    (0..bytes).map(|_| r.next_u64() as u8).collect()
}

/// One rank's point-to-point patterns (gather, scatter, all-to-all-v with messages to itself,
/// ring, hypercube, several messages per pair, a size mismatch), each one group, through
/// `Collectives::send_recv`, with messages of 0 bytes to many rounds.
fn role_p2p() -> R<()> {
    use mscclpp::collectives::{P2pKind, P2pOp};
    let (rank, n) = multiproc::rank_and_size();
    let uid: UniqueId = std::env::var(UID_VAR).map_err(e)?.parse().map_err(e)?;
    let boot = Arc::new(
        Bootstrap::new(&uid, rank, n, BootstrapConfig::from_env().map_err(e)?).map_err(e)?,
    );
    let backend = mscclpp::registry::probe(BackendKind::Host).map_err(e)?;
    let device = backend.open_device(rank).map_err(e)?;
    let comm = Arc::new(Communicator::new(boot, device.clone()));
    // 256-byte slots: 128 data bytes per round, so a 5 KB message takes 40 rounds.
    let coll = typed::collectives(comm.clone(), 256).map_err(e)?;
    let stream = device.create_stream().map_err(e)?;
    // A pattern: per rank, its (kind, peer, bytes) in call order; sizes by (src, dst, k).
    type Pattern = Vec<Vec<(P2pKind, usize, usize)>>;
    let size = |src: usize, dst: usize, k: usize| (src * 7 + dst * 13 + k * 5) % 11 * 523 + k;
    let mut patterns: Vec<(&str, Pattern)> = Vec::new();
    let each = |f: &dyn Fn(usize) -> Vec<(P2pKind, usize, usize)>| (0..n).map(f).collect();
    // Gather to the last rank (its own block by a copy to itself), scatter from rank 0.
    let root = n - 1;
    patterns.push((
        "gather",
        each(&|r| {
            let mut v = vec![(P2pKind::Send, root, size(r, root, 0))];
            if r == root {
                v.extend((0..n).map(|p| (P2pKind::Recv, p, size(p, root, 0))));
            }
            v
        }),
    ));
    patterns.push((
        "scatter",
        each(&|r| {
            let mut v = Vec::new();
            if r == 0 {
                v.extend((0..n).map(|p| (P2pKind::Send, p, size(0, p, 0))));
            }
            v.push((P2pKind::Recv, 0, size(0, r, 0)));
            v
        }),
    ));
    // All-to-all-v, receives first, some messages empty.
    patterns.push((
        "alltoallv",
        each(&|r| {
            let mut v: Vec<_> = (0..n).map(|p| (P2pKind::Recv, p, size(p, r, 1))).collect();
            v.extend((0..n).map(|p| (P2pKind::Send, p, size(r, p, 1))));
            v
        }),
    ));
    patterns.push((
        "ring",
        each(&|r| {
            vec![
                (P2pKind::Send, (r + 1) % n, 5000),
                (P2pKind::Recv, (r + n - 1) % n, 5000),
            ]
        }),
    ));
    // Several messages per pair, matched in order.
    patterns.push((
        "pairs_many",
        each(&|r| {
            let mut v = Vec::new();
            for k in 0..3 {
                for p in (0..n).filter(|&p| p != r) {
                    v.push((P2pKind::Send, p, size(r, p, k)));
                    v.push((P2pKind::Recv, p, size(p, r, k)));
                }
            }
            v
        }),
    ));
    let mut hypercube = Vec::new();
    let mut d = 1;
    while d < n {
        if n.is_power_of_two() {
            let name: &'static str = Box::leak(format!("hypercube_{d}").into_boxed_str());
            hypercube.push((
                name,
                each(&|r| {
                    vec![
                        (P2pKind::Recv, r ^ d, size(r ^ d, r, 2)),
                        (P2pKind::Send, r ^ d, size(r, r ^ d, 2)),
                    ]
                }),
            ));
        }
        d *= 2;
    }
    patterns.extend(hypercube);
    let cap = 3 * n * 6000 + 64;
    let sbuf = device.alloc(cap, MemoryKind::Device).map_err(e)?;
    let rbuf = device.alloc(cap, MemoryKind::Device).map_err(e)?;
    let mut ops_run = 0;
    for (pi, (name, pat)) in patterns.iter().enumerate() {
        let mine = &pat[rank];
        stream.fill(&rbuf.full(), POISON).map_err(e)?;
        // Lay the messages out back to back; the k-th message per (kind, peer) is message k.
        let mut slices = Vec::new();
        let (mut so, mut ro) = (0, 0);
        let mut nth = std::collections::HashMap::new();
        for &(kind, peer, bytes) in mine {
            let k = nth.entry((kind, peer)).or_insert(0usize);
            let (buf, off) = match kind {
                P2pKind::Send => (&sbuf, &mut so),
                P2pKind::Recv => (&rbuf, &mut ro),
            };
            let sl = buf.slice(*off..*off + bytes.max(1)).map_err(e)?;
            if kind == P2pKind::Send {
                stream
                    .write_from_host(
                        &sl.slice(..bytes).map_err(e)?,
                        &p2p_msg(pi as u64, rank, peer, *k, bytes),
                    )
                    .map_err(e)?;
            }
            slices.push((sl, *k));
            *off += bytes.max(1);
            *k += 1;
        }
        let ops: Vec<P2pOp> = mine
            .iter()
            .zip(&slices)
            .map(|(&(kind, peer, bytes), (sl, _))| P2pOp {
                kind,
                peer,
                buffer: sl,
                bytes,
            })
            .collect();
        coll.send_recv(&ops, &*stream)
            .map_err(|x| format!("{name}: {x}"))?;
        stream
            .synchronize_timeout(Duration::from_secs(60))
            .map_err(|x| format!("{name}: {x}"))?;
        for (&(kind, peer, bytes), (sl, k)) in mine.iter().zip(&slices) {
            if kind != P2pKind::Recv {
                continue;
            }
            let mut got = vec![0u8; bytes + 1];
            stream
                .read_to_host(&mut got[..bytes.max(1)], sl)
                .map_err(e)?;
            if got[..bytes] != p2p_msg(pi as u64, peer, rank, *k, bytes)[..] {
                return Err(format!(
                    "{name}: message {k} of {bytes} bytes from rank {peer} is wrong"
                ));
            }
            if bytes == 0 && got[0] != POISON {
                return Err(format!("{name}: an empty receive wrote its buffer"));
            }
            ops_run += 1;
        }
        comm.bootstrap().barrier().map_err(e)?;
    }
    // A size mismatch is an error on the receiver naming both ranks; nobody hangs and the
    // next exchange still works.
    let s = sbuf.slice(..100).map_err(e)?;
    let r = rbuf.slice(..100).map_err(e)?;
    let (to, from) = ((rank + 1) % n, (rank + n - 1) % n);
    let ops = [
        P2pOp {
            kind: P2pKind::Send,
            peer: to,
            buffer: &s,
            bytes: 100,
        },
        P2pOp {
            kind: P2pKind::Recv,
            peer: from,
            buffer: &r,
            bytes: 64,
        },
    ];
    match coll
        .send_recv(&ops, &*stream)
        .and_then(|()| stream.synchronize())
    {
        Ok(()) => return Err("a size mismatch was accepted".into()),
        Err(x)
            if x.to_string().contains(&format!(
                "rank {from} sent 100 bytes to rank {rank}, which receives 64"
            )) => {}
        Err(x) => return Err(format!("unclear mismatch error: {x}")),
    }
    let ops = [
        P2pOp {
            kind: P2pKind::Send,
            peer: to,
            buffer: &s,
            bytes: 100,
        },
        P2pOp {
            kind: P2pKind::Recv,
            peer: from,
            buffer: &r,
            bytes: 100,
        },
    ];
    coll.send_recv(&ops, &*stream).map_err(e)?;
    stream.synchronize().map_err(e)?;
    // A send to oneself without its receive, and a peer out of range, are refused at once.
    let bad = [P2pOp {
        kind: P2pKind::Send,
        peer: rank,
        buffer: &s,
        bytes: 8,
    }];
    if coll.send_recv(&bad, &*stream).is_ok() {
        return Err("a send to oneself without a receive was accepted".into());
    }
    let bad = [P2pOp {
        kind: P2pKind::Send,
        peer: n,
        buffer: &s,
        bytes: 8,
    }];
    if coll.send_recv(&bad, &*stream).is_ok() {
        return Err("a peer out of range was accepted".into());
    }
    multiproc::report("received", ops_run);
    comm.bootstrap().barrier().map_err(e)?;
    Ok(())
}

fn run_p2p(n: usize) -> Result<(), Failed> {
    let outs = multiproc::spawn_with_root("p2p", n, UID_VAR, &[], Duration::from_secs(300))?;
    eprintln!(
        "    {n} ranks: {} messages received per rank",
        outs[0].reports()["received"]
    );
    Ok(())
}

fn run_env(n: usize, slot: u64, counts: &str, extra: &[(&str, &str)]) -> Result<(), Failed> {
    run_on(BackendKind::Host, n, slot, counts, extra)
}

/// A GPU trial: ignored, with the reason, where the backend cannot be probed here.
fn gpu_trial(
    kind: BackendKind,
    name: &str,
    n: usize,
    counts: &'static str,
    extra: Vec<(&'static str, &'static str)>,
) -> Trial {
    Trial::ignorable_test(format!("collectives::{kind}::{name}"), move || {
        if let Err(reason) = mscclpp::registry::probe(kind) {
            return Ok(Completion::ignored_with(
                mscclpp_conformance::harness::ignore_reason(reason),
            ));
        }
        run_on(kind, n, DEFAULT_SLOT_BYTES, counts, &extra).map(|()| Completion::Completed)
    })
}

/// Forces the direct algorithm for every collective.
const DIRECT: &[(&str, &str)] = &[
    ("MSCCLPP_ALGO_ALLREDUCE", "direct"),
    ("MSCCLPP_ALGO_ALLGATHER", "direct"),
    ("MSCCLPP_ALGO_REDUCESCATTER", "direct"),
    ("MSCCLPP_ALGO_BROADCAST", "direct"),
    ("MSCCLPP_ALGO_ALLTOALL", "direct"),
];

/// Forces the read algorithm for all-reduce (the one collective it serves) and registers
/// buffers: every rank's in-place input is registered, out of place only the even ranks'.
const READ_REGISTERED: &[(&str, &str)] = &[
    ("MSCCLPP_ALGO_ALLREDUCE", "read"),
    ("MSCCLPP_TEST_KINDS", "allreduce"),
    ("MSCCLPP_TEST_REGISTER", "1"),
    ("MSCCLPP_TEST_DTYPES", SOME_DTYPES),
];

/// Types of every width and kind, for the trials that need not run every type (the kernels
/// switch on the type at run time there: one of each width covers the paths).
const SOME_DTYPES: &str = "float,bfloat16,int32,double,uint64,int8,f8e4m3";

/// LL128 lines forced for all-reduce (counts beyond one round fall back to LL or direct).
const LL128: &[(&str, &str)] = &[
    ("MSCCLPP_ALGO_ALLREDUCE", "ll128"),
    ("MSCCLPP_TEST_KINDS", "allreduce"),
    ("MSCCLPP_TEST_DTYPES", SOME_DTYPES),
];

/// GPU element counts: odd ones from 1 to past the read algorithm's 4 MiB (bf16), so that the
/// default choice crosses every algorithm.
const GPU_COUNTS: &str = "1,7,1001,65537,262147,1048573,2097155";

/// Odd ranks keep one-round calls on the general LL kernel, even ranks take the short kernels.
const SHORT_MIXED: &[(&str, &str)] = &[("MSCCLPP_TEST_SHORT_ODD_OFF", "1")];

/// Forces LL (its short kernels where a call fits them) for every collective: the host
/// backend's choice by size never takes it.
const LL: &[(&str, &str)] = &[
    ("MSCCLPP_ALGO_ALLREDUCE", "ll"),
    ("MSCCLPP_ALGO_ALLGATHER", "ll"),
    ("MSCCLPP_ALGO_REDUCESCATTER", "ll"),
    ("MSCCLPP_ALGO_BROADCAST", "ll"),
    ("MSCCLPP_ALGO_ALLTOALL", "ll"),
];

/// [`SHORT_MIXED`] with LL forced, for the host backend (where direct is chosen otherwise).
const SHORT_MIXED_LL: &[(&str, &str)] = &[
    ("MSCCLPP_TEST_SHORT_ODD_OFF", "1"),
    ("MSCCLPP_ALGO_ALLREDUCE", "ll"),
    ("MSCCLPP_ALGO_ALLGATHER", "ll"),
    ("MSCCLPP_ALGO_REDUCESCATTER", "ll"),
    ("MSCCLPP_ALGO_BROADCAST", "ll"),
    ("MSCCLPP_ALGO_ALLTOALL", "ll"),
];

/// The copy-engine algorithm forced for every collective (reduce-scatter and all-reduce with
/// their small reduction kernel), with 4 KiB of scratch so that larger counts take many chunks
/// (GPUs: the default scratch), and its burst and graph checks.
const CE: &[(&str, &str)] = &[
    ("MSCCLPP_ALGO_ALLREDUCE", "ce"),
    ("MSCCLPP_ALGO_ALLGATHER", "ce"),
    ("MSCCLPP_ALGO_BROADCAST", "ce"),
    ("MSCCLPP_ALGO_ALLTOALL", "ce"),
    ("MSCCLPP_ALGO_REDUCESCATTER", "ce"),
    (
        "MSCCLPP_TEST_KINDS",
        "allreduce,allgather,broadcast,alltoall,reducescatter",
    ),
    ("MSCCLPP_TEST_ALGO", "ce"),
    ("MSCCLPP_CE_SCRATCH_BYTES", "4096"),
    ("MSCCLPP_TEST_DTYPES", SOME_DTYPES),
];

/// The same on GPUs, with the default scratch (two 32 MiB buffers: the largest GPU count is one
/// chunk; the host trials cover many).
const CE_GPU: &[(&str, &str)] = &[
    ("MSCCLPP_ALGO_ALLREDUCE", "ce"),
    ("MSCCLPP_ALGO_ALLGATHER", "ce"),
    ("MSCCLPP_ALGO_BROADCAST", "ce"),
    ("MSCCLPP_ALGO_ALLTOALL", "ce"),
    ("MSCCLPP_ALGO_REDUCESCATTER", "ce"),
    (
        "MSCCLPP_TEST_KINDS",
        "allreduce,allgather,broadcast,alltoall,reducescatter",
    ),
    ("MSCCLPP_TEST_ALGO", "ce"),
    ("MSCCLPP_TEST_DTYPES", SOME_DTYPES),
];

/// Nothing forced, the copy engines chosen by size from 4 KiB per rank block
/// (`MSCCLPP_CE_AUTO_BYTES`): the matrix's small counts take the usual choice (LL on GPUs,
/// direct on the host backend), its large ones the copy engines.
const CE_BY_SIZE: &[(&str, &str)] = &[
    ("MSCCLPP_CE_AUTO_BYTES", "4096"),
    (
        "MSCCLPP_TEST_KINDS",
        "allreduce,allgather,broadcast,alltoall,reducescatter",
    ),
    ("MSCCLPP_TEST_ALGO", "ce_by_size"),
    ("MSCCLPP_CE_SCRATCH_BYTES", "4096"),
    ("MSCCLPP_TEST_DTYPES", SOME_DTYPES),
];

/// The read algorithm with nothing registered: every input is staged.
const READ_STAGED: &[(&str, &str)] = &[
    ("MSCCLPP_ALGO_ALLREDUCE", "read"),
    ("MSCCLPP_TEST_KINDS", "allreduce"),
    ("MSCCLPP_TEST_DTYPES", SOME_DTYPES),
];

fn run_on(
    kind: BackendKind,
    n: usize,
    slot: u64,
    counts: &str,
    extra: &[(&str, &str)],
) -> Result<(), Failed> {
    run_role("matrix", kind, n, slot, counts, extra)
}

fn run_role(
    role: &str,
    kind: BackendKind,
    n: usize,
    slot: u64,
    counts: &str,
    extra: &[(&str, &str)],
) -> Result<(), Failed> {
    let mut env = vec![
        ("MSCCLPP_TEST_SLOT".to_string(), slot.to_string()),
        ("MSCCLPP_TEST_COUNTS".to_string(), counts.to_string()),
        (BACKEND_VAR.to_string(), kind.to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let outs = multiproc::spawn_with_root(role, n, UID_VAR, &env, Duration::from_secs(600))?;
    let rep = outs[0].reports();
    let wrong: usize = outs
        .iter()
        .map(|o| {
            o.reports()
                .get("wrong")
                .and_then(|w| w.parse().ok())
                .unwrap_or(1)
        })
        .sum();
    eprintln!(
        "    {n} ranks: {} calls per rank, {wrong} wrong elements, {} s",
        rep["calls"], rep["seconds"]
    );
    if wrong > 0 {
        let logs: Vec<String> = outs.iter().map(|o| o.stderr.clone()).collect();
        return Err(format!("{wrong} wrong elements\n{}", logs.join("\n")).into());
    }
    Ok(())
}

fn main() {
    multiproc::run_child(|role| match role {
        "matrix" => role_matrix(),
        "p2p" => role_p2p(),
        "streams" => role_streams(),
        other => Err(format!("unknown role {other}")),
    });
    let args = libtest_mimic::Arguments::from_args();
    // Small slots force many rounds: 256-byte slots carry 128 data bytes per peer per round.
    type Env = &'static [(&'static str, &'static str)];
    // Host trials: (name, ranks, slot bytes, counts, environment). Small slots force many
    // rounds: 256-byte slots carry 128 data bytes per peer per round.
    let host: [(&str, usize, u64, &'static str, Env); 19] = [
        // LL forced: the host backend's choice by size takes direct for every call (the
        // direct:: trials below), and these small slots make LL run many rounds.
        ("ll::2_ranks", 2, 256, "1,3,37,1001", LL),
        ("ll::3_ranks", 3, 512, "1,5,333", LL),
        ("ll::4_ranks", 4, 1024, "1,7,300", LL),
        ("ll::8_ranks", 8, 4096, "1,129", LL),
        // Nothing forced: the choice by size (direct on the host).
        ("3_ranks", 3, 512, "1,5,333", &[]),
        // The direct algorithm, forced at every size: chunks of 4 KiB per step make the larger
        // counts take several steps.
        ("direct::2_ranks", 2, 256, "1,3,37,5001", DIRECT),
        ("direct::3_ranks", 3, 512, "1,5,3333", DIRECT),
        ("direct::4_ranks", 4, 1024, "1,7,2100", DIRECT),
        // LL128 lines: 64 KiB slots carry 61 440 data bytes per round.
        ("ll128::2_ranks", 2, 65536, "1,3,37,5001,15359,15361", LL128),
        ("ll128::3_ranks", 3, 65536, "1,5,333,7681", LL128),
        // The read all-reduce, with registered (read in place), staged and mixed inputs.
        ("read::2_ranks", 2, 256, "1,3,37,5001", READ_REGISTERED),
        ("read::3_ranks", 3, 256, "1,5,3333", READ_REGISTERED),
        ("read::4_ranks_staged", 4, 256, "1,7,2100", READ_STAGED),
        ("read::8_ranks", 8, 4096, "1,129", READ_REGISTERED),
        // Short and general LL kernels mixed across ranks.
        ("short_mixed::3_ranks", 3, 512, "1,5,333", SHORT_MIXED_LL),
        // The copy-engine algorithm (no kernel), 4 KiB chunks.
        ("ce::2_ranks", 2, 256, "1,3,37,5001", CE),
        ("ce::3_ranks", 3, 256, "1,5,3333", CE),
        ("ce::8_ranks", 8, 4096, "1,129", CE),
        ("ce::by_size_2_ranks", 2, 256, "1,37,5001", CE_BY_SIZE),
    ];
    let mut trials: Vec<Trial> = host
        .into_iter()
        .map(|(name, n, slot, counts, env)| {
            Trial::test(format!("collectives::host::{name}"), move || {
                run_env(n, slot, counts, env)
            })
        })
        .collect();
    for n in [2, 3, 4] {
        trials.push(Trial::test(
            format!("collectives::host::p2p::{n}_ranks"),
            move || run_p2p(n),
        ));
    }
    for n in [2, 3] {
        trials.push(Trial::test(
            format!("collectives::host::two_streams::{n}_ranks"),
            move || run_role("streams", BackendKind::Host, n, DEFAULT_SLOT_BYTES, "", &[]),
        ));
    }
    // The same matrix on the GPUs where there are some (2 ranks: one per GPU, or both on one;
    // 4 ranks: 2 per GPU, where LL128 is refused since two ranks share a device and LL serves).
    let gpu: [(&str, usize, Env); 11] = [
        ("read::2_ranks", 2, READ_REGISTERED),
        ("read::2_ranks_staged", 2, READ_STAGED),
        ("read::4_ranks", 4, READ_REGISTERED),
        ("ll128::2_ranks", 2, LL128),
        ("ll128::4_ranks", 4, LL128),
        ("default::2_ranks", 2, &[]),
        // Every kind with 4 ranks (the short kernels' any-rank path), and short kernels on some
        // ranks with the general kernel on the others.
        ("default::4_ranks", 4, &[]),
        ("short_mixed::2_ranks", 2, SHORT_MIXED),
        ("short_mixed::4_ranks", 4, SHORT_MIXED),
        ("ce::2_ranks", 2, CE_GPU),
        ("ce::4_ranks", 4, CE_GPU),
    ];
    for kind in [BackendKind::Cuda, BackendKind::Rocm] {
        for (name, n, env) in gpu {
            trials.push(gpu_trial(kind, name, n, GPU_COUNTS, env.to_vec()));
        }
        trials.push(Trial::ignorable_test(
            format!("collectives::{kind}::two_streams::2_ranks"),
            move || {
                if let Err(reason) = mscclpp::registry::probe(kind) {
                    return Ok(Completion::ignored_with(
                        mscclpp_conformance::harness::ignore_reason(reason),
                    ));
                }
                run_role("streams", kind, 2, DEFAULT_SLOT_BYTES, "", &[])
                    .map(|()| Completion::Completed)
            },
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}
