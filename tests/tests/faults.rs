//! A rank killed (SIGKILL) at each phase — bootstrap init, connection set-up, an LL all-reduce,
//! a direct all-reduce, a port-channel exchange, copy-engine calls — and a chaos run of random kills: every
//! survivor must fail, naming the dead rank, within a few seconds of the kill, with the default
//! settings; none may hang or exit 0. Ranks are processes of this binary on the host backend.
//! The `gpu` trials (`faults::cuda::*`, `faults::rocm::*`; ignored, with the reason, where the
//! backend cannot be probed) run two ranks on the GPUs there are (one GPU shared is fine) and kill
//! one mid LL all-reduce, mid direct all-reduce, mid send/receive and mid copy-engine calls: the
//! survivor's kernel must give up on the communicator's abort word (the copy-engine calls' stream
//! waits are released instead), so that its call fails naming the dead rank within 2 s, and its
//! device must still work afterwards (no trap, no CUDA error).
//! Runs with `cargo test -p mscclpp-conformance --test faults -- --nocapture` (the chaos trial
//! prints its summary; `MSCCLPP_CHAOS_TRIALS` sets the number of trials).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::{Completion, Failed, Trial};
use mscclpp::collectives::{
    AlgorithmId, CollectiveCall, CollectiveKind, DataType, P2pKind, P2pOp, ReduceOp,
};
use mscclpp::comm::Communicator;
use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot, UniqueId};
use mscclpp::comm::proxy::ProxyService;
use mscclpp::comm::semaphore::Host2DeviceSemaphore;
use mscclpp::hal::{BackendKind, Device, LaunchConfig, MemoryKind, Stream};
use mscclpp::transports::{EndpointConfig, Transport, TransportFlags};
use mscclpp::typed;
use mscclpp_conformance::devcode;
use mscclpp_conformance::multiproc::{self, ChildOutcome, Running};
use mscclpp_conformance::rng::Rng;

const UID_VAR: &str = "MSCCLPP_TEST_UID";
const DIR_VAR: &str = "MSCCLPP_TEST_DIR";
const PHASE_VAR: &str = "MSCCLPP_FAULT_PHASE";
const VICTIM_VAR: &str = "MSCCLPP_FAULT_VICTIM";
const SEED_VAR: &str = "MSCCLPP_FAULT_SEED";
const BACKEND_VAR: &str = "MSCCLPP_FAULT_BACKEND";

/// The GPU trials' bound from the kill to the survivor's report (the target).
const GPU_REPORT_DEADLINE: Duration = Duration::from_secs(2);

/// What a survivor is allowed between the kill and its report: the target is 2 s, CI machines
/// are slow and loaded, so the assertion leaves room; the times are printed.
const REPORT_DEADLINE: Duration = Duration::from_secs(5);
/// Past this a child is a hang and is killed.
const HANG_DEADLINE: Duration = Duration::from_secs(30);

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

fn env_usize(k: &str) -> Option<usize> {
    std::env::var(k).ok().and_then(|v| v.parse().ok())
}

/// Marks a step reached, for the parent (which kills the victim once every rank got there).
fn mark(step: &str) {
    if let Ok(dir) = std::env::var(DIR_VAR) {
        let (rank, _) = multiproc::rank_and_size();
        let _ = std::fs::write(PathBuf::from(dir).join(format!("{step}-{rank}")), b"");
    }
}

struct Rank {
    comm: Arc<Communicator>,
    device: Arc<dyn Device>,
    stream: Arc<dyn Stream>,
    rank: usize,
    n: usize,
}

fn setup() -> R<Rank> {
    let (rank, n) = multiproc::rank_and_size();
    let uid: UniqueId = std::env::var(UID_VAR).map_err(e)?.parse().map_err(e)?;
    let boot = Arc::new(
        Bootstrap::new(&uid, rank, n, BootstrapConfig::from_env().map_err(e)?).map_err(e)?,
    );
    let kind: BackendKind = match std::env::var(BACKEND_VAR) {
        Ok(v) => v.parse().map_err(e)?,
        Err(_) => BackendKind::Host,
    };
    let backend = mscclpp::registry::probe(kind).map_err(e)?;
    // GPUs: the ranks share the devices there are.
    let ordinal = match kind {
        BackendKind::Host => rank,
        _ => rank % backend.device_count().max(1),
    };
    let device = backend.open_device(ordinal).map_err(e)?;
    let stream = device.create_stream().map_err(e)?;
    Ok(Rank {
        comm: Arc::new(Communicator::new(boot, device.clone())),
        device,
        stream,
        rank,
        n,
    })
}

/// The rank body of every trial: runs `phase` until it fails; the error goes to the parent
/// with the time it was seen.
fn role_fault() -> R<()> {
    let phase = std::env::var(PHASE_VAR).map_err(e)?;
    let victim = env_usize(VICTIM_VAR);
    let (rank, _) = multiproc::rank_and_size();
    if phase == "bootstrap" {
        // The others are (about to be) in the rendezvous when the victim is killed.
        mark("ready");
    }
    if phase == "bootstrap" && victim == Some(rank) {
        // Never joins: killed while the others are in the rendezvous.
        std::thread::sleep(HANG_DEADLINE * 2);
        return Ok(());
    }
    let r = match setup() {
        Ok(r) => r,
        Err(err) => return Err(fail(err)),
    };
    let result = body(&r, &phase, victim);
    if result.is_err() && r.device.info().backend != BackendKind::Host {
        multiproc::report("device_after", device_after(&r));
    }
    // Drop everything (an orderly goodbye on the bootstrap) before reporting.
    drop(r);
    result.map_err(fail)
}

/// Whether the device still works after the failure ("ok", else what failed): a kernel that
/// trapped would have left the context unusable (every later call fails).
fn device_after(r: &Rank) -> String {
    let check = || -> R<()> {
        r.stream.synchronize().map_err(e)?;
        let a = r.device.alloc(4096, MemoryKind::Device).map_err(e)?;
        let b = r.device.alloc(4096, MemoryKind::Device).map_err(e)?;
        r.stream.copy(&b.full(), &a.full()).map_err(e)?;
        r.stream.synchronize().map_err(e)
    };
    match check() {
        Ok(()) => "ok".into(),
        Err(err) => err.replace('\n', " "),
    }
}

fn fail(err: String) -> String {
    // Lets the parent stop waiting for a rank that failed before it got ready.
    mark("ready");
    multiproc::report("failed_at_unix_us", unix_us());
    multiproc::report("error", err.replace('\n', " "));
    err
}

fn body(r: &Rank, phase: &str, victim: Option<usize>) -> R<()> {
    match phase {
        "bootstrap" => {
            // Only reached when the rendezvous completed without the victim: a failure.
            Err("the bootstrap completed without the killed rank".into())
        }
        "connect" => {
            mark("ready");
            if victim == Some(r.rank) {
                std::thread::sleep(HANG_DEADLINE * 2);
            }
            // Collectives set up a connection and exchange memory with every peer; the victim
            // is killed before it takes part.
            let _c = typed::collectives(r.comm.clone(), 4096).map_err(e)?;
            Err("set-up completed without the killed rank".into())
        }
        "ll" | "direct" => {
            let coll = typed::collectives(r.comm.clone(), 4096).map_err(e)?;
            // Blocks of 1 KiB (LL) and 2 MiB (direct) per rank.
            let count = if phase == "ll" {
                256 * r.n
            } else {
                (512 << 10) * r.n
            };
            let buf = r.device.alloc(count * 4, MemoryKind::Device).map_err(e)?;
            let id = coll.algorithm(CollectiveKind::AllReduce, (count * 4 / r.n) as u64);
            let want = if phase == "ll" {
                [AlgorithmId::Ll, AlgorithmId::LlShort]
            } else {
                [AlgorithmId::Direct, AlgorithmId::Read]
            };
            if !want.contains(&id) {
                return Err(format!("phase {phase} runs {id}"));
            }
            mark("ready");
            loop {
                coll.run(
                    &CollectiveCall::new(
                        CollectiveKind::AllReduce,
                        &buf.full(),
                        &buf.full(),
                        count,
                        DataType::F32,
                    )
                    .op(ReduceOp::Sum),
                    &*r.stream,
                )
                .map_err(e)?;
                r.stream.synchronize().map_err(e)?;
            }
        }
        "ce" => ce_loop(r),
        "p2p" => p2p_loop(r),
        "port" => port_loop(r),
        "chaos" => chaos_loop(r),
        other => Err(format!("unknown phase {other}")),
    }
}

/// Copy-engine calls (asked for per call), each several chunks of the host backend's scratch:
/// their streams wait on flags with no kernel, so a dead peer is seen through the release of
/// the waits (GPUs; on the host backend the waits also poll the abort word) and the next call's
/// refusal.
fn ce_loop(r: &Rank) -> R<()> {
    let coll = typed::collectives(r.comm.clone(), 4096).map_err(e)?;
    // 2 MiB per rank block: 4 chunks of the host backend's default scratch.
    let count = 512 << 10;
    let input = r
        .device
        .alloc(count * 4 * r.n, MemoryKind::Device)
        .map_err(e)?;
    let output = r
        .device
        .alloc(count * 4 * r.n, MemoryKind::Device)
        .map_err(e)?;
    let (inp, out) = (input.full(), output.full());
    let kinds = [
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllReduce,
    ];
    // One call of each kind before the kill: the first reduce-scatter and all-reduce load (on a
    // GPU with a cold cache, compile) the reduction kernel, and a survivor compiling when the
    // peer dies reports only once the compiler returns: the trial would time the compiler, not
    // the release (docs/faults.md).
    for kind in kinds {
        let call = CollectiveCall::new(kind, &inp, &out, count, DataType::F32)
            .algorithm(Some(AlgorithmId::Ce));
        coll.run(&call, &*r.stream).map_err(e)?;
        r.stream.synchronize().map_err(e)?;
    }
    mark("ready");
    for i in 0.. {
        let call = CollectiveCall::new(kinds[i % kinds.len()], &inp, &out, count, DataType::F32)
            .algorithm(Some(AlgorithmId::Ce));
        coll.run(&call, &*r.stream).map_err(e)?;
        r.stream.synchronize().map_err(e)?;
    }
    Ok(())
}

/// Send/receive rings of 64 KiB (several rounds of the point-to-point kernel per call).
fn p2p_loop(r: &Rank) -> R<()> {
    let coll = typed::collectives(r.comm.clone(), 4096).map_err(e)?;
    const BYTES: usize = 64 << 10;
    let a = r.device.alloc(BYTES, MemoryKind::Device).map_err(e)?;
    let b = r.device.alloc(BYTES, MemoryKind::Device).map_err(e)?;
    let next = (r.rank + 1) % r.n;
    let prev = (r.rank + r.n - 1) % r.n;
    let (sa, sb) = (a.full(), b.full());
    mark("ready");
    loop {
        let ops = [
            P2pOp {
                kind: P2pKind::Send,
                peer: next,
                buffer: &sa,
                bytes: BYTES,
            },
            P2pOp {
                kind: P2pKind::Recv,
                peer: prev,
                buffer: &sb,
                bytes: BYTES,
            },
        ];
        coll.send_recv(&ops, &*r.stream).map_err(e)?;
        r.stream.synchronize().map_err(e)?;
    }
}

/// Port-channel puts with signal between pairs (0-1, 2-3, ...), waited on in a kernel.
fn port_loop(r: &Rank) -> R<()> {
    const LEN: usize = 64 << 10;
    let peer = r.rank ^ 1;
    let conn = r
        .comm
        .connect(peer, EndpointConfig::new(Transport::CudaIpc))
        .map_err(e)?;
    let sem = Arc::new(Host2DeviceSemaphore::new(&r.comm, conn).map_err(e)?);
    let data = r.device.alloc(LEN, MemoryKind::Device).map_err(e)?;
    let src = r.device.alloc(LEN, MemoryKind::Device).map_err(e)?;
    let flags = TransportFlags::single(Transport::CudaIpc);
    let mine = r.comm.register_memory(&data.full(), flags).map_err(e)?;
    let theirs = r.comm.exchange_memory(&mine, peer).map_err(e)?;
    let local_src = r.comm.register_memory(&src.full(), flags).map_err(e)?;
    let mut service = ProxyService::new(&r.device, 64).map_err(e)?;
    let sid = service.add_semaphore(sem).map_err(e)?;
    let dst = service.add_memory(Arc::new(theirs)).map_err(e)?;
    let srcid = service.add_memory(Arc::new(local_src)).map_err(e)?;
    let h = service.port_channel(sid, dst, srcid).map_err(e)?;
    service.start().map_err(e)?;
    mark("ready");
    let t = Duration::from_secs(60);
    let result = loop {
        // Kernels launched here poll the communicator's abort word in their waits.
        let _abort = r.comm.abort_scope();
        let launched = devcode::launch(
            &r.device,
            &*r.stream,
            LaunchConfig::linear(1, 1),
            move |_, _| {
                // SAFETY: the FIFO and semaphore outlive the kernel (the service is stopped
                // only after the stream is synchronised).
                unsafe {
                    h.put_with_signal_and_flush(0, 0, LEN as u64, t)?;
                    h.wait(t)
                }
            },
        );
        if let Err(x) = launched.and_then(|()| r.stream.synchronize()) {
            break Err(e(x));
        }
    };
    let _ = service.stop();
    result
}

/// A random mix of barriers, LL and direct all-reduces and send/receive rings, the same on
/// every rank (one seed).
fn chaos_loop(r: &Rank) -> R<()> {
    let seed = env_usize(SEED_VAR).unwrap_or(1) as u64;
    let mut rng = Rng::new(seed);
    let coll = typed::collectives(r.comm.clone(), 4096).map_err(e)?;
    const MAX: usize = 64 << 10;
    let a = r.device.alloc(MAX * 4, MemoryKind::Device).map_err(e)?;
    let b = r.device.alloc(MAX * 4, MemoryKind::Device).map_err(e)?;
    mark("ready");
    loop {
        match rng.below(4) {
            0 => r.comm.bootstrap().barrier().map_err(e)?,
            k @ (1 | 2) => {
                // A packet-sized call, or one of the pipelined algorithms.
                let count = if k == 1 {
                    1 + rng.below(512) as usize
                } else {
                    (16 << 10) + rng.below((MAX - (16 << 10)) as u64) as usize
                };
                coll.run(
                    &CollectiveCall::new(
                        CollectiveKind::AllReduce,
                        &a.full(),
                        &a.full(),
                        count,
                        DataType::F32,
                    )
                    .op(ReduceOp::Sum),
                    &*r.stream,
                )
                .map_err(e)?;
            }
            _ => {
                let bytes = 1 + rng.below(8192) as usize;
                let next = (r.rank + 1) % r.n;
                let prev = (r.rank + r.n - 1) % r.n;
                let sa = a.slice(0..bytes).map_err(e)?;
                let sb = b.slice(0..bytes).map_err(e)?;
                let ops = [
                    P2pOp {
                        kind: P2pKind::Send,
                        peer: next,
                        buffer: &sa,
                        bytes,
                    },
                    P2pOp {
                        kind: P2pKind::Recv,
                        peer: prev,
                        buffer: &sb,
                        bytes,
                    },
                ];
                coll.send_recv(&ops, &*r.stream).map_err(e)?;
            }
        }
        r.stream.synchronize().map_err(e)?;
    }
}

// ---------------------------------------------------------------------------------------------

/// One trial's rank processes, in a directory of their own.
struct Job {
    children: Vec<Running>,
    dir: PathBuf,
    _root: BootstrapRoot,
    victim: usize,
    n: usize,
}

fn start(phase: &str, n: usize, victim: usize, seed: u64, extra: &[(&str, &str)]) -> Job {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("mscclpp-faults-{}-{k}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("trial directory");
    let timeout = extra
        .iter()
        .find(|(k, _)| *k == "MSCCLPP_BOOTSTRAP_TIMEOUT")
        .and_then(|(_, v)| v.parse().ok())
        .map_or(BootstrapConfig::default().timeout, Duration::from_secs);
    let cfg = BootstrapConfig {
        timeout,
        ..BootstrapConfig::default()
    };
    let (root, uid) =
        BootstrapRoot::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), n, &cfg).expect("root");
    let mut env: Vec<(String, String)> = vec![
        (UID_VAR.into(), uid.to_string()),
        (DIR_VAR.into(), dir.display().to_string()),
        (PHASE_VAR.into(), phase.into()),
        (VICTIM_VAR.into(), victim.to_string()),
        (SEED_VAR.into(), seed.to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let children = (0..n)
        .map(|r| multiproc::spawn("fault", r, n, &env))
        .collect();
    Job {
        children,
        dir,
        _root: root,
        victim,
        n,
    }
}

fn all_reached(dir: &Path, step: &str, ranks: impl Iterator<Item = usize>) -> bool {
    ranks
        .into_iter()
        .all(|r| dir.join(format!("{step}-{r}")).exists())
}

/// One survivor's outcome.
#[derive(Debug)]
struct Seen {
    rank: usize,
    /// From the kill to its report (`None`: no report).
    took: Option<Duration>,
    named: bool,
    hung: bool,
    exit0: bool,
    crashed: bool,
    error: String,
    /// GPU ranks: "ok" when the device still worked after the failure, else what failed.
    device_after: Option<String>,
}

/// Waits until every rank reached "ready", then `pause`, kills the victim and collects.
fn kill_and_collect(job: Job, pause: Duration) -> Result<Vec<Seen>, String> {
    let Job {
        mut children,
        dir,
        _root,
        victim,
        n,
    } = job;
    let by = Instant::now() + HANG_DEADLINE;
    while !all_reached(&dir, "ready", 0..n) {
        if Instant::now() > by {
            children.iter_mut().for_each(|c| c.kill());
            let outs: Vec<_> = children
                .into_iter()
                .map(|c| multiproc::wait(c, Instant::now()))
                .map(|o| o.describe())
                .collect();
            return Err(format!("ranks did not get ready:\n{}", outs.join("\n")));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(pause);
    children[victim].kill();
    let killed_at = unix_us();
    let deadline = Instant::now() + HANG_DEADLINE;
    let outs: Vec<ChildOutcome> = children
        .into_iter()
        .map(|c| multiproc::wait(c, deadline))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    let mut seen = Vec::new();
    for o in outs {
        if o.rank == victim {
            continue;
        }
        let rep = o.reports();
        let error = rep.get("error").cloned().unwrap_or_default();
        let took = rep
            .get("failed_at_unix_us")
            .and_then(|v| v.parse::<u128>().ok())
            .map(|t| Duration::from_micros(t.saturating_sub(killed_at) as u64));
        seen.push(Seen {
            rank: o.rank,
            took,
            named: names(&error, victim),
            hung: o.timed_out,
            exit0: o.code == Some(0),
            crashed: o.code.is_none() && !o.timed_out,
            error: if took.is_none() { o.describe() } else { error },
            device_after: rep.get("device_after").cloned(),
        });
    }
    Ok(seen)
}

/// Whether `error` names rank `v` ("rank 2", or in a list: "ranks [2]", "ranks [1, 2]").
fn names(error: &str, v: usize) -> bool {
    error.contains(&format!("rank {v}"))
        || [
            format!("[{v}]"),
            format!("[{v},"),
            format!(" {v},"),
            format!(" {v}]"),
        ]
        .iter()
        .any(|p| error.contains(p.as_str()))
}

fn check(phase: &str, seen: &[Seen], victim: usize) -> Result<(), Failed> {
    let mut worst = Duration::ZERO;
    for s in seen {
        if s.hung || s.exit0 || s.crashed || s.took.is_none() {
            return Err(format!(
                "{phase}: rank {} (hung {}, exit 0 {}, crashed {}): {}",
                s.rank, s.hung, s.exit0, s.crashed, s.error
            )
            .into());
        }
        if !s.named {
            return Err(format!(
                "{phase}: rank {}'s error does not name rank {victim}: {}",
                s.rank, s.error
            )
            .into());
        }
        worst = worst.max(s.took.unwrap_or_default());
    }
    let times: Vec<String> = seen
        .iter()
        .map(|s| {
            format!(
                "r{} {:.0} ms",
                s.rank,
                s.took.unwrap_or_default().as_secs_f64() * 1e3
            )
        })
        .collect();
    eprintln!(
        "    {phase}: every survivor failed naming rank {victim}: {}",
        times.join(", ")
    );
    if let Some(s) = seen.first() {
        // The expected error, wrapped: one line ran to 220 characters.
        let head = format!("    {phase}: expected error, e.g. rank {}:", s.rank);
        eprintln!(
            "{}",
            mscclpp_conformance::harness::wrapped(&head, &s.error.to_string())
        );
    }
    if worst > REPORT_DEADLINE {
        return Err(format!("{phase}: a survivor took {worst:?}").into());
    }
    Ok(())
}

fn phase_trial(phase: &'static str, extra: &'static [(&'static str, &'static str)]) -> Trial {
    Trial::test(format!("faults::killed_during_{phase}"), move || {
        const N: usize = 4;
        const VICTIM: usize = 2;
        let job = start(phase, N, VICTIM, 1, extra);
        let seen = kill_and_collect(job, Duration::from_millis(200))?;
        check(phase, &seen, VICTIM)
    })
}

/// A GPU trial of `phase` with two ranks (rank 1 killed): ignored, with the reason, where the
/// backend cannot be probed. Besides [`check`], the survivor must report within
/// [`GPU_REPORT_DEADLINE`] and its device must still work.
fn gpu_trial(kind: BackendKind, phase: &'static str, algo: &'static str) -> Trial {
    Trial::ignorable_test(
        format!("faults::{kind}::killed_during_{phase}"),
        move || {
            if let Err(reason) = mscclpp::registry::probe(kind) {
                return Ok(Completion::ignored_with(
                    mscclpp_conformance::harness::ignore_reason(reason),
                ));
            }
            const N: usize = 2;
            const VICTIM: usize = 1;
            let mut extra = vec![(BACKEND_VAR, kind.to_string())];
            if !algo.is_empty() {
                extra.push(("MSCCLPP_ALGO_ALLREDUCE", algo.to_string()));
            }
            let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let job = start(phase, N, VICTIM, 1, &extra);
            // Long enough for the first calls to compile their kernels and run.
            let seen = kill_and_collect(job, Duration::from_millis(500))?;
            let name = format!("{kind} {phase}");
            check(&name, &seen, VICTIM)?;
            for s in &seen {
                let took = s.took.unwrap_or_default();
                if took > GPU_REPORT_DEADLINE {
                    return Err(format!(
                    "{name}: rank {} reported {took:?} after the kill (bound {GPU_REPORT_DEADLINE:?}): {}",
                    s.rank, s.error
                )
                .into());
                }
                match s.device_after.as_deref() {
                    Some("ok") => {}
                    other => {
                        return Err(format!(
                            "{name}: rank {}'s device after the failure: {}",
                            s.rank,
                            other.unwrap_or("not reported")
                        )
                        .into());
                    }
                }
            }
            Ok(Completion::Completed)
        },
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Random kills of one rank of 4 to 8, at a random moment of a random mix, `trials` times
/// (two jobs at a time).
fn chaos() -> Result<(), Failed> {
    let trials = env_usize("MSCCLPP_CHAOS_TRIALS").unwrap_or(200);
    let seed = env_usize("MSCCLPP_CHAOS_SEED").unwrap_or(0x5eed) as u64;
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let mut times = Vec::new();
    let (mut survivors, mut named, mut hangs, mut exit0, mut crashes) = (0, 0, 0, 0, 0);
    let mut failures: Vec<String> = Vec::new();
    let mut misnamed: Vec<String> = Vec::new();
    let mut done = 0;
    while done < trials {
        let batch = 2.min(trials - done);
        let jobs: Vec<(Job, Duration)> = (0..batch)
            .map(|_| {
                let n = 4 + rng.below(5) as usize;
                let victim = rng.below(n as u64) as usize;
                let pause = Duration::from_millis(rng.below(300));
                (start("chaos", n, victim, rng.next_u64() >> 1, &[]), pause)
            })
            .collect();
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|(job, pause)| {
                let victim = job.victim;
                let n = job.n;
                std::thread::spawn(move || (n, victim, kill_and_collect(job, pause)))
            })
            .collect();
        for h in handles {
            let (n, victim, r) = h.join().map_err(|_| "a trial thread panicked")?;
            match r {
                Err(why) => failures.push(format!("{n} ranks, victim {victim}: {why}")),
                Ok(seen) => {
                    for s in seen {
                        survivors += 1;
                        named += usize::from(s.named);
                        hangs += usize::from(s.hung);
                        exit0 += usize::from(s.exit0);
                        crashes += usize::from(s.crashed);
                        match s.took {
                            Some(t) if !s.hung && !s.exit0 && !s.crashed => times.push(t),
                            _ => failures.push(format!(
                                "{n} ranks, victim {victim}, rank {}: {}",
                                s.rank, s.error
                            )),
                        }
                        if !s.named && misnamed.len() < 20 {
                            misnamed.push(format!(
                                "{n} ranks, victim {victim}, rank {} does not name it: {}",
                                s.rank, s.error
                            ));
                        }
                    }
                }
            }
        }
        done += batch;
    }
    times.sort();
    let max = times.last().copied().unwrap_or_default();
    // Naming is recorded, and must hold for at least 99 % of the survivors: a survivor whose only
    // news came from a peer that had already failed and closed in order may still name that peer
    // (about 1 in 1 000 on a 2-core machine); a hang, an exit 0 or a crash fails on any one.
    for m in &misnamed {
        eprintln!("    chaos, named another rank: {m}");
    }
    if (survivors - named) * 100 > survivors {
        failures.extend(misnamed.iter().cloned());
    }
    eprintln!(
        "    chaos: {trials} trials, {survivors} survivors in {:.1} s; detection p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; named the dead rank {named}/{survivors} ({:.1} %); hangs {hangs}, exit 0 {exit0}, crashes {crashes}",
        started.elapsed().as_secs_f64(),
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3,
        100.0 * named as f64 / survivors.max(1) as f64,
    );
    if !failures.is_empty() {
        return Err(format!(
            "chaos: {} problems, e.g.:\n{}",
            failures.len(),
            failures
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        )
        .into());
    }
    if max > REPORT_DEADLINE {
        return Err(format!("chaos: a survivor took {max:?}").into());
    }
    Ok(())
}

fn main() {
    multiproc::run_child(|role| match role {
        "fault" => role_fault(),
        other => Err(format!("unknown role {other}")),
    });
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![
        // The victim never joins: the others fail at the bootstrap deadline (set short here;
        // a rank that never connected cannot be seen dying), naming the missing rank.
        phase_trial("bootstrap", &[("MSCCLPP_BOOTSTRAP_TIMEOUT", "2")]),
        phase_trial("connect", &[]),
        // Forced: the host backend's choice by size takes direct for every call.
        phase_trial("ll", &[("MSCCLPP_ALGO_ALLREDUCE", "ll")]),
        phase_trial("direct", &[]),
        phase_trial("port", &[]),
        phase_trial("ce", &[]),
        Trial::test("faults::chaos_random_kills", chaos),
    ];
    let mut trials = trials;
    for kind in [BackendKind::Cuda, BackendKind::Rocm] {
        trials.push(gpu_trial(kind, "ll", "ll"));
        trials.push(gpu_trial(kind, "direct", "direct"));
        trials.push(gpu_trial(kind, "p2p", ""));
        trials.push(gpu_trial(kind, "ce", ""));
    }
    libtest_mimic::run(&args, trials).exit();
}
