//! A rank killed (SIGKILL) while its peers execute a plan on the host backend: every survivor's
//! execution fails within a few seconds naming the dead rank (the launch polls the
//! communicator's abort word in every block thread), none hangs or exits 0, and a later
//! `execute` on the failed communicator is refused at once, naming the rank too.
//! Ranks are processes of this binary. Runs with
//! `cargo test -p mscclpp-executor --test faults -- --nocapture` (times are printed).
//!
//! The GPU trials (`faults::cuda::*`, `faults::rocm::*`; ignored, with the reason, where the
//! backend cannot be probed, e.g. in a build without its feature) run two ranks on the GPUs there
//! are (one GPU shared is fine) and kill rank 1 while rank 0's device interpreter waits for it in
//! a Simple and in an LL plan: the kernel must give up on the communicator's abort word instead of
//! spinning to its limit and trapping, so that the survivor fails naming rank 1 within 2 s, and
//! its device must still work afterwards (a synchronisation, an allocation and a copy):
//! `cargo test -p mscclpp-executor --features cuda --test faults -- --nocapture cuda::`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::{Completion, Failed, Trial};
use mscclpp::comm::Communicator;
use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot, UniqueId};
use mscclpp::hal::{BackendKind, DataType, Device, MemoryKind, Stream};
use mscclpp_conformance::multiproc;
use mscclpp_executor::{Executor, Plan, testgen};

const UID_VAR: &str = "MSCCLPP_TEST_UID";
const DIR_VAR: &str = "MSCCLPP_TEST_DIR";
const PLAN_VAR: &str = "MSCCLPP_FAULT_PLAN";
const BACKEND_VAR: &str = "MSCCLPP_FAULT_BACKEND";
const VICTIM: usize = 1;
/// What a survivor may take between the kill and its report: the target is 2 s; CI machines are
/// slow and loaded, so the assertion leaves room.
const REPORT_DEADLINE: Duration = Duration::from_secs(5);
/// The GPU trials' bound from the kill to the survivor's report (the target).
const GPU_REPORT_DEADLINE: Duration = Duration::from_secs(2);
/// Past this a child is a hang and is killed (the waits' own timeout is a minute).
const HANG_DEADLINE: Duration = Duration::from_secs(30);
/// How long GPU ranks may take to get ready: the first load of the interpreter compiles it with
/// NVRTC or hipRTC (tens of seconds when the kernel cache is cold).
const GPU_READY_DEADLINE: Duration = Duration::from_secs(300);

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

fn plan_json(name: &str, n: usize) -> R<serde_json::Value> {
    Ok(match name {
        "simple" => testgen::allreduce_simple(n, false),
        "ll" => testgen::allreduce_ll(n, false),
        "nvls" => testgen::allreduce_nvls(n, false),
        other => return Err(format!("unknown plan {other}")),
    })
}

/// One rank: sets the plan up with every rank and runs it once; then the victim stops taking
/// part (and is killed) while the others execute it in a loop, stuck in its waits.
fn role_rank() -> R<()> {
    let (rank, n) = multiproc::rank_and_size();
    let uid: UniqueId = std::env::var(UID_VAR).map_err(e)?.parse().map_err(e)?;
    let dir = PathBuf::from(std::env::var(DIR_VAR).map_err(e)?);
    let which = std::env::var(PLAN_VAR).map_err(e)?;
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
    let comm = Arc::new(Communicator::new(boot, device.clone()));
    let exec = Executor::new(comm.clone()).map_err(e)?;
    let bytes = serde_json::to_vec(&plan_json(&which, n)?).map_err(e)?;
    let plan = Plan::from_bytes(&bytes, n).map_err(e)?;
    let stream = device.create_stream().map_err(e)?;
    let elems = 1024 * n;
    let send = device.alloc(elems * 4, MemoryKind::Device).map_err(e)?;
    let recv = device.alloc(elems * 4, MemoryKind::Device).map_err(e)?;
    let run = || -> R<()> {
        exec.execute(
            &plan,
            &send.full(),
            &recv.full(),
            DataType::F32,
            None,
            &*stream,
        )
        .map_err(e)?;
        stream.synchronize().map_err(e)
    };
    run()?;
    comm.bootstrap().barrier().map_err(e)?;
    std::fs::write(dir.join(format!("ready-{rank}")), b"").map_err(e)?;
    if rank == VICTIM {
        std::thread::sleep(HANG_DEADLINE * 2);
        return Ok(());
    }
    let err = loop {
        if let Err(m) = run() {
            break m;
        }
    };
    multiproc::report("failed_at_unix_us", unix_us());
    multiproc::report("error", err.replace('\n', " "));
    // The communicator is known failed: the next execution is refused before it launches.
    let t = Instant::now();
    let again = match run() {
        Ok(()) => "ran".to_string(),
        Err(m) => m.replace('\n', " "),
    };
    multiproc::report("again", again);
    multiproc::report("again_us", t.elapsed().as_micros());
    if kind != BackendKind::Host {
        multiproc::report("device_after", device_after(&device, &*stream));
    }
    Ok(())
}

/// Whether the device still works after the failure ("ok", else what failed): a kernel that
/// trapped would have left the context unusable (every later call fails).
fn device_after(device: &Arc<dyn Device>, stream: &dyn Stream) -> String {
    let check = || -> R<()> {
        stream.synchronize().map_err(e)?;
        let a = device.alloc(4096, MemoryKind::Device).map_err(e)?;
        let b = device.alloc(4096, MemoryKind::Device).map_err(e)?;
        stream
            .write_from_host(&a.full(), &[0x5a; 4096])
            .map_err(e)?;
        stream.copy(&b.full(), &a.full()).map_err(e)?;
        let mut back = vec![0u8; 4096];
        stream.read_to_host(&mut back, &b.full()).map_err(e)?;
        stream.synchronize().map_err(e)?;
        if back.iter().any(|&x| x != 0x5a) {
            return Err("a copy after the failure read back wrong bytes".into());
        }
        Ok(())
    };
    match check() {
        Ok(()) => "ok".into(),
        Err(err) => err.replace('\n', " "),
    }
}

fn names_victim(error: &str) -> bool {
    error.contains(&format!("rank {VICTIM}"))
}

fn killed_during(plan: &'static str, kind: BackendKind) -> Result<(), Failed> {
    let gpu = kind != BackendKind::Host;
    // Two ranks on GPUs (the fewest devices, shared when there is one); three on the host.
    let n = if gpu { 2 } else { 3 };
    let which = if gpu {
        format!("{kind} {plan}")
    } else {
        plan.to_string()
    };
    let dir = std::env::temp_dir().join(format!(
        "mscclpp-executor-faults-{kind}-{plan}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(e)?;
    let ready_deadline = if gpu {
        GPU_READY_DEADLINE
    } else {
        HANG_DEADLINE
    };
    let mut cfg = BootstrapConfig::default();
    if gpu {
        cfg.timeout = GPU_READY_DEADLINE;
    }
    let (_root, uid) = BootstrapRoot::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), n, &cfg)?;
    let mut env = vec![
        (UID_VAR.to_string(), uid.to_string()),
        (DIR_VAR.to_string(), dir.display().to_string()),
        (PLAN_VAR.to_string(), plan.to_string()),
        (BACKEND_VAR.to_string(), kind.to_string()),
    ];
    if gpu {
        // A rank that compiled the interpreter first waits for the other in the set-up.
        env.push((
            "MSCCLPP_BOOTSTRAP_TIMEOUT".to_string(),
            GPU_READY_DEADLINE.as_secs().to_string(),
        ));
    }
    let mut children: Vec<_> = (0..n)
        .map(|r| multiproc::spawn("rank", r, n, &env))
        .collect();
    let by = Instant::now() + ready_deadline;
    while !(0..n).all(|r| dir.join(format!("ready-{r}")).exists()) {
        if Instant::now() > by {
            children.iter_mut().for_each(|c| c.kill());
            let outs: Vec<String> = children
                .into_iter()
                .map(|c| multiproc::wait(c, Instant::now()).describe())
                .collect();
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!("ranks did not get ready:\n{}", outs.join("\n")).into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // The survivors are inside their next execution, waiting for the victim (on GPUs, in the
    // interpreter kernel's waits).
    std::thread::sleep(Duration::from_millis(if gpu { 500 } else { 200 }));
    children[VICTIM].kill();
    let killed_at = unix_us();
    let deadline = Instant::now() + HANG_DEADLINE;
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| multiproc::wait(c, deadline))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    let mut times = Vec::new();
    for o in outs.iter().filter(|o| o.rank != VICTIM) {
        let rep = o.reports();
        let (Some(error), Some(at)) = (rep.get("error"), rep.get("failed_at_unix_us")) else {
            return Err(format!(
                "{which}: rank {} reported no failure: {}",
                o.rank,
                o.describe()
            )
            .into());
        };
        if !o.ok() {
            return Err(format!("{which}: rank {}: {}", o.rank, o.describe()).into());
        }
        if !names_victim(error) {
            return Err(format!(
                "{which}: rank {}'s error does not name rank {VICTIM}: {error}",
                o.rank
            )
            .into());
        }
        let again = rep.get("again").cloned().unwrap_or_default();
        if !names_victim(&again) {
            return Err(format!(
                "{which}: rank {}'s execution after the failure was not refused naming rank {VICTIM}: {again}",
                o.rank
            )
            .into());
        }
        let took =
            Duration::from_micros(at.parse::<u128>().map_err(e)?.saturating_sub(killed_at) as u64);
        let bound = if gpu {
            GPU_REPORT_DEADLINE
        } else {
            REPORT_DEADLINE
        };
        if took > bound {
            return Err(format!(
                "{which}: rank {} took {took:?} (bound {bound:?}): {error}",
                o.rank
            )
            .into());
        }
        if gpu {
            match rep.get("device_after").map(String::as_str) {
                Some("ok") => {}
                other => {
                    return Err(format!(
                        "{which}: rank {}'s device after the failure: {}",
                        o.rank,
                        other.unwrap_or("not reported")
                    )
                    .into());
                }
            }
        }
        times.push(format!("r{} {:.0} ms", o.rank, took.as_secs_f64() * 1e3));
        if times.len() == 1 {
            // The expected errors, wrapped: one line ran to 250 characters.
            let head = format!("    {which}: expected errors, e.g. rank {}:", o.rank);
            eprintln!(
                "{}",
                mscclpp_conformance::harness::wrapped(&head, &format!("{error}; then: {again}"))
            );
        }
    }
    eprintln!(
        "    {which}: every survivor failed naming rank {VICTIM}: {}",
        times.join(", ")
    );
    Ok(())
}

fn main() {
    multiproc::run_child(|role| match role {
        "rank" => role_rank(),
        other => Err(format!("unknown role {other}")),
    });
    let args = libtest_mimic::Arguments::from_args();
    let mut trials: Vec<Trial> = ["simple", "ll", "nvls"]
        .into_iter()
        .map(|w| {
            Trial::test(format!("faults::killed_during_{w}_plan"), move || {
                killed_during(w, BackendKind::Host)
            })
        })
        .collect();
    // GPUs refuse NVLS plans (no multicast objects), so their trials are Simple and LL.
    for kind in [BackendKind::Cuda, BackendKind::Rocm] {
        for w in ["simple", "ll"] {
            trials.push(Trial::ignorable_test(
                format!("faults::{kind}::killed_during_{w}_plan"),
                move || {
                    if let Err(reason) = mscclpp::registry::probe(kind) {
                        return Ok(Completion::ignored_with(
                            mscclpp_conformance::harness::ignore_reason(reason),
                        ));
                    }
                    killed_during(w, kind).map(|()| Completion::Completed)
                },
            ));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
