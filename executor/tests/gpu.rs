//! The testgen plans on 2 ranks as separate processes, per backend: on GPUs the device
//! interpreter (`kernels/executor/executor.cu`) against the CPU reference, with the ranks on two
//! GPUs where there are two and both on one GPU (same-device IPC); on the host backend the same
//! cases through processes (IPC between processes). A backend this machine or binary lacks
//! lists its cases as ignored, with the reason.
//!
//! Every case: all-reduce (Simple and LL) and all-gather, in place and out of place, in i32, f32,
//! f16 and bf16 (small integers: every sum is exact), and an all-reduce with the operator
//! overridden (max); the NVLS plans (run on the host, refused with a clear error on GPUs); outputs
//! poisoned first; each plan executed three times on the same buffers
//! (the LL flag advances and the scratch halves alternate) with fresh data each time.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Completion, Failed, Trial};
use mscclpp::comm::bootstrap::{BootstrapConfig, BootstrapRoot};
use mscclpp::hal::{BackendKind, DataType, MemoryKind, ReduceOp};
use mscclpp_conformance::multiproc;
use mscclpp_executor::{Executor, Plan, testgen};

const UID_VAR: &str = "MSCCLPP_TEST_UID";
const BACKEND_VAR: &str = "MSCCLPP_TEST_BACKEND";
/// `1`: every rank on device 0 (two processes sharing one GPU).
const SHARE_VAR: &str = "MSCCLPP_TEST_SHARE_DEVICE";
const POISON: u8 = 0xA5;
const REPEATS: usize = 3;
const NRANKS: usize = 2;

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    AllReduce,
    AllGather,
}

/// Input element `i` of rank `r` in round `round`: small integers, exact in every type.
fn value(round: usize, r: usize, i: usize) -> f64 {
    ((i * 7 + r * 5 + round * 3) % 17) as f64 - 8.0
}

/// One plan, `elems` elements per rank input, checked [`REPEATS`] times.
#[allow(clippy::too_many_arguments)]
fn check_plan(
    exec: &Executor,
    device: &Arc<dyn mscclpp::hal::Device>,
    plan_json: serde_json::Value,
    kind: Kind,
    inplace: bool,
    elems: usize,
    dtype: DataType,
    op: Option<ReduceOp>,
) -> R<()> {
    let comm = exec.communicator();
    let (rank, n) = (comm.rank(), comm.nranks());
    let bytes = serde_json::to_vec(&plan_json).map_err(e)?;
    let plan = Plan::from_bytes(&bytes, n).map_err(e)?;
    let what = format!(
        "{} {kind:?} {} {dtype} x{elems}{}",
        plan.name,
        if inplace { "in place" } else { "out of place" },
        op.map_or(String::new(), |o| format!(" op {o}"))
    );
    let es = dtype.size();
    let stream = device.create_stream().map_err(e)?;
    let out_elems = if kind == Kind::AllGather {
        elems * n
    } else {
        elems
    };
    let inbuf = device.alloc(elems * es, MemoryKind::Device).map_err(e)?;
    let outbuf = device
        .alloc(out_elems * es, MemoryKind::Device)
        .map_err(e)?;
    let (send, recv) = match (kind, inplace) {
        (Kind::AllReduce, true) => (inbuf.full(), inbuf.full()),
        (Kind::AllGather, true) => (
            outbuf
                .slice(rank * elems * es..(rank + 1) * elems * es)
                .map_err(e)?,
            outbuf.full(),
        ),
        _ => (inbuf.full(), outbuf.full()),
    };
    for round in 0..REPEATS {
        stream.fill(&outbuf.full(), POISON).map_err(e)?;
        let mut mine = Vec::with_capacity(elems * es);
        for i in 0..elems {
            dtype.encode_f64(value(round, rank, i), &mut mine);
        }
        stream.write_from_host(&send, &mine).map_err(e)?;
        stream.synchronize().map_err(e)?;
        // Every rank's input is in place before anyone reads it, and nobody poisons an output
        // a peer is still writing.
        comm.bootstrap().barrier().map_err(e)?;
        exec.execute(&plan, &send, &recv, dtype, op, &*stream)
            .map_err(|x| format!("{what}: {x}"))?;
        stream
            .synchronize()
            .map_err(|x| format!("{what} round {round}: {x}"))?;
        let mut got = vec![0u8; recv.len()];
        stream.read_to_host(&mut got, &recv).map_err(e)?;
        let expected = |j: usize| -> f64 {
            match kind {
                Kind::AllReduce => {
                    let vals = (0..n).map(|p| value(round, p, j));
                    match op.unwrap_or(ReduceOp::Sum) {
                        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
                        ReduceOp::Prod => vals.product(),
                        ReduceOp::Sum | ReduceOp::Avg => vals.sum(),
                    }
                }
                Kind::AllGather => value(round, j / elems, j % elems),
            }
        };
        let wrong: Vec<usize> = got
            .chunks_exact(es)
            .enumerate()
            .filter(|(j, b)| dtype.decode_f64(b) != expected(*j))
            .map(|(j, _)| j)
            .collect();
        if let Some(&j) = wrong.first() {
            return Err(format!(
                "{what} round {round}: element {j} is {}, expected {} ({} wrong of {out_elems})",
                dtype.decode_f64(&got[j * es..(j + 1) * es]),
                expected(j),
                wrong.len()
            ));
        }
        comm.bootstrap().barrier().map_err(e)?;
    }
    Ok(())
}

/// One rank: every plan, type and size.
fn role_plans() -> R<()> {
    let (_, n) = multiproc::rank_and_size();
    let share = std::env::var(SHARE_VAR).is_ok_and(|v| v == "1");
    let (comm, device, kind) = multiproc::rank_communicator(UID_VAR, BACKEND_VAR, share)?;
    let exec = Executor::new(comm).map_err(e)?;
    // Element counts: whole 16-byte units per chunk (the plans' buffer_alignment); on GPUs one
    // large enough that every thread of a block takes several 16-byte units.
    let counts: &[usize] = match kind {
        BackendKind::Host => &[2048],
        _ => &[2048, 1 << 20],
    };
    let mut cases = 0;
    for &elems in counts {
        for dtype in [DataType::I32, DataType::F32, DataType::F16, DataType::BF16] {
            for inplace in [false, true] {
                for (make, kind) in [
                    (
                        testgen::allreduce_simple as fn(usize, bool) -> serde_json::Value,
                        Kind::AllReduce,
                    ),
                    (testgen::allreduce_ll, Kind::AllReduce),
                    (testgen::allgather_simple, Kind::AllGather),
                ] {
                    check_plan(
                        &exec,
                        &device,
                        make(n, inplace),
                        kind,
                        inplace,
                        elems,
                        dtype,
                        None,
                    )?;
                    cases += 1;
                }
            }
        }
        for make in [testgen::allreduce_simple, testgen::allreduce_ll] {
            check_plan(
                &exec,
                &device,
                make(n, false),
                Kind::AllReduce,
                false,
                elems,
                DataType::I32,
                Some(ReduceOp::Max),
            )?;
            cases += 1;
        }
    }
    // NVLS plans: the host backend emulates multicast and runs them; GPUs refuse them at set-up
    // with a clear error (this build never creates a multicast object there).
    let nvls = [
        (
            testgen::allreduce_nvls as fn(usize, bool) -> serde_json::Value,
            Kind::AllReduce,
        ),
        (testgen::allgather_nvls, Kind::AllGather),
        (testgen::allgather_nvls_ll, Kind::AllGather),
    ];
    for (make, k) in nvls {
        let got = check_plan(
            &exec,
            &device,
            make(n, false),
            k,
            false,
            2048,
            DataType::F32,
            None,
        );
        match (kind, got) {
            (BackendKind::Host, r) => {
                r?;
                cases += 1;
            }
            (_, Ok(())) => return Err(format!("{kind}: an NVLS plan ran on a GPU")),
            (_, Err(m)) if m.contains("host backend only") => {}
            (_, Err(m)) => return Err(format!("{kind}: NVLS plan refused unclearly: {m}")),
        }
    }
    multiproc::report("cases", cases);
    Ok(())
}

fn run(kind: BackendKind, share: bool) -> Result<(), Failed> {
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(60),
        ..BootstrapConfig::default()
    };
    let (_root, uid) =
        BootstrapRoot::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), NRANKS, &cfg)?;
    let env = vec![
        (UID_VAR.to_string(), uid.to_string()),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT".to_string(), "120".to_string()),
        (BACKEND_VAR.to_string(), kind.to_string()),
        (
            SHARE_VAR.to_string(),
            if share { "1" } else { "0" }.to_string(),
        ),
    ];
    let outs = multiproc::spawn_ranks("plans", NRANKS, &env, Duration::from_secs(600));
    multiproc::all_ok(&outs)?;
    let cases = outs[0].reports().get("cases").cloned().unwrap_or_default();
    eprintln!("    {NRANKS} ranks: {cases} plan executions checked per rank (x{REPEATS})");
    Ok(())
}

fn main() {
    multiproc::run_child(|role| match role {
        "plans" => role_plans(),
        other => Err(format!("unknown role {other}")),
    });
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = Vec::new();
    for kind in BackendKind::ALL {
        let shapes: &[(&str, bool)] = match kind {
            BackendKind::Host => &[("2_ranks", false)],
            // Two GPUs: one rank each; and both ranks on one GPU (the only shape on a machine
            // with one).
            _ => &[("2_ranks", false), ("2_ranks_one_gpu", true)],
        };
        for &(name, share) in shapes {
            trials.push(Trial::ignorable_test(
                format!("executor::{kind}::{name}"),
                move || {
                    if let Err(reason) = mscclpp::registry::probe(kind) {
                        return Ok(Completion::ignored_with(
                            mscclpp_conformance::harness::ignore_reason(reason),
                        ));
                    }
                    run(kind, share).map(|()| Completion::Completed)
                },
            ));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
