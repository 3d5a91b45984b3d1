//! `mscclpp-perf bootstrap`: the bootstrap at scale. Ranks run as processes (the standalone
//! launcher, or mpirun & co.) or, with `--threads`, as threads of this process. Rank 0 prints
//! one row: time to the first barrier, barrier, all-gather of 64 B and 4 KiB, split, the
//! connections, sockets and threads per rank, and the peak RSS.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot, Schedule, UniqueId};
use mscclpp::hal::{Error, Result};
use mscclpp_perf::launch::{self, Role};

/// Set by the standalone parent before it spawns the ranks: when it started (unix µs), so that
/// rank 0 can report the launch-to-first-barrier time.
const T0_VAR: &str = "MSCCLPP_PERF_BOOT_T0_US";

/// Ranks' figures, gathered to rank 0.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    /// From the launcher's start to this rank's start (µs; processes only): the launcher's
    /// share of the time to the first barrier.
    spawn_us: f64,
    /// From this rank's `Bootstrap::new` to the end of its first barrier (µs).
    join_us: f64,
    /// From the launcher's start to the end of this rank's first barrier (µs; processes).
    launch_us: f64,
    barrier_us: f64,
    ag64_us: f64,
    ag4k_us: f64,
    split_us: f64,
    links: usize,
    sockets: usize,
    /// Threads of the rank's process (processes; with `--threads`, of the whole process).
    threads: usize,
    rss_kib: usize,
}

impl Figures {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        for x in [
            self.spawn_us,
            self.join_us,
            self.launch_us,
            self.barrier_us,
            self.ag64_us,
            self.ag4k_us,
            self.split_us,
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for x in [self.links, self.sockets, self.threads, self.rss_kib] {
            v.extend_from_slice(&(x as u64).to_le_bytes());
        }
        v
    }

    fn decode(b: &[u8], rank: usize) -> Result<Self> {
        if b.len() != 88 {
            return Err(Error::malformed(
                "bootstrap benchmark figures",
                format!("rank {rank} sent {} bytes, expected 88", b.len()),
            ));
        }
        let word = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i * 8..i * 8 + 8]);
            a
        };
        let f = |i| f64::from_le_bytes(word(i));
        let u = |i| u64::from_le_bytes(word(i)) as usize;
        Ok(Figures {
            spawn_us: f(0),
            join_us: f(1),
            launch_us: f(2),
            barrier_us: f(3),
            ag64_us: f(4),
            ag4k_us: f(5),
            split_us: f(6),
            links: u(7),
            sockets: u(8),
            threads: u(9),
            rss_kib: u(10),
        })
    }
}

fn unix_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// A number of /proc/self/status ("VmHWM:" → the peak RSS in KiB, "Threads:").
fn status_field(name: &str) -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The peak resident set of this process (VmHWM), in KiB.
fn peak_rss_kib() -> usize {
    status_field("VmHWM:")
}

/// Open sockets of this process (listeners included), each counted once however many
/// descriptors refer to it.
fn sockets() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| {
        d.flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|t| t.to_string_lossy().into_owned())
            .filter(|t| t.starts_with("socket:"))
            .collect::<std::collections::HashSet<_>>()
            .len()
    })
}

/// A limit of this process from /proc/self/limits ("Max open files" → soft value).
fn limit(name: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/limits").ok()?;
    let l = s.lines().find(|l| l.starts_with(name))?;
    l[name.len()..].split_whitespace().next()?.parse().ok()
}

/// MemAvailable of this machine in bytes (0 if unknown: nothing large is then attempted).
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

fn read_num(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn avg_us(reps: u32, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..reps {
        f()?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / f64::from(reps.max(1)))
}

/// One rank's measurements after its bootstrap is up (`started`: when `Bootstrap::new` began).
///
/// `t0`: when the launcher started (unix µs), if it said.
fn measure(
    boot: &Bootstrap,
    started: Instant,
    t0: Option<u128>,
    reps: u32,
    count_sockets: bool,
) -> Result<Figures> {
    boot.barrier()?;
    let join_us = started.elapsed().as_secs_f64() * 1e6;
    let launch_us = t0.map_or(0.0, |t0| unix_us().saturating_sub(t0) as f64);
    let barrier_us = avg_us(reps, || boot.barrier())?;
    let small = vec![1u8; 64];
    let ag64_us = avg_us(reps, || boot.all_gather(&small).map(|_| ()))?;
    // Every rank's result holds N * 4 KiB: skipped (reported as 0) where all the results, with
    // their copies in flight, would not fit in the memory available.
    let total = (boot.nranks() as u64).pow(2) * 4096 * 3;
    let ag4k_us = if total <= mem_available() {
        let big = vec![2u8; 4096];
        avg_us(reps.div_ceil(4), || boot.all_gather(&big).map(|_| ()))?
    } else {
        0.0
    };
    boot.barrier()?;
    let t = Instant::now();
    // Two contiguous halves, as a split by node would be: with a power-of-two rank count each
    // half's tree is a subtree of the parent's, so the split opens no connection.
    let half = boot.nranks().div_ceil(2).max(1);
    let child = boot.split(Some((boot.rank() / half) as u32), boot.rank() as u32)?;
    if let Some(c) = &child {
        c.barrier()?;
    }
    let split_us = t.elapsed().as_secs_f64() * 1e6;
    boot.barrier()?;
    Ok(Figures {
        spawn_us: 0.0,
        join_us,
        launch_us,
        barrier_us,
        ag64_us,
        ag4k_us,
        split_us,
        links: boot.link_stats().open,
        sockets: if count_sockets { sockets() } else { 0 },
        threads: status_field("Threads:"),
        rss_kib: peak_rss_kib(),
    })
}

fn print_row(n: usize, mode: &str, schedule: Schedule, all: &[Figures]) {
    let max = |f: fn(&Figures) -> f64| all.iter().map(f).fold(0.0, f64::max);
    let maxu = |f: fn(&Figures) -> usize| all.iter().map(f).max().unwrap_or(0);
    let avg_links = all.iter().map(|f| f.links).sum::<usize>() as f64 / all.len().max(1) as f64;
    println!(
        "# {:>6} {:>8} {:>6} {:>11} {:>11} {:>10} {:>11} {:>10} {:>10} {:>9} {:>11} {:>11} {:>12} {:>9}",
        "ranks",
        "mode",
        "sched",
        "launch(ms)",
        "spawned(ms)",
        "join(ms)",
        "barrier(us)",
        "ag64(us)",
        "ag4K(us)",
        "split(ms)",
        "links max/avg",
        "sockets max",
        "threads/rank",
        "RSS(MiB)"
    );
    // Per process: each rank's own with processes, the whole process with threads.
    let rss = maxu(|f| f.rss_kib) as f64 / 1024.0;
    // With threads every rank sees the whole process: its threads shared among the ranks.
    let threads = if mode == "threads" {
        maxu(|f| f.threads) as f64 / all.len().max(1) as f64
    } else {
        maxu(|f| f.threads) as f64
    };
    println!(
        "  {:>6} {:>8} {:>6} {:>11} {:>11.1} {:>10.1} {:>11.1} {:>10.1} {:>10.1} {:>9.1} {:>7}/{:<5.1} {:>11} {:>12.2} {:>9.1}",
        n,
        mode,
        format!("{schedule:?}").to_lowercase(),
        if mode == "threads" {
            "-".to_string()
        } else {
            format!("{:.1}", max(|f| f.launch_us) / 1e3)
        },
        max(|f| f.spawn_us) / 1e3,
        max(|f| f.join_us) / 1e3,
        max(|f| f.barrier_us),
        max(|f| f.ag64_us),
        max(|f| f.ag4k_us),
        max(|f| f.split_us) / 1e3,
        maxu(|f| f.links),
        avg_links,
        if mode == "threads" {
            "-".to_string()
        } else {
            maxu(|f| f.sockets).to_string()
        },
        threads,
        rss
    );
}

fn print_limits(n: usize) {
    let text = format!(
        "limits: open files {} (soft), processes/threads {} (soft), pid_max {}, threads-max {}, vm.max_map_count {}; {} CPUs",
        limit("Max open files").map_or("?".into(), |v| v.to_string()),
        limit("Max processes").map_or("?".into(), |v| v.to_string()),
        read_num("/proc/sys/kernel/pid_max").map_or("?".into(), |v| v.to_string()),
        read_num("/proc/sys/kernel/threads-max").map_or("?".into(), |v| v.to_string()),
        read_num("/proc/sys/vm/max_map_count").map_or("?".into(), |v| v.to_string()),
        std::thread::available_parallelism().map_or(0, |p| p.get()),
    );
    // Wrapped as every comment of the tool (at 100 characters).
    for line in crate::report::wrap_comment(&text) {
        println!("{line}");
    }
    println!("# {n} ranks; figures are the slowest rank's (links: open bootstrap connections)");
}

/// Entry point of the subcommand (parent, spawned rank, or launched rank).
pub fn main(nranks: Option<usize>, threads: bool, reps: u32) -> Result<ExitCode> {
    let role = launch::role()?;
    if let Role::Parent = role {
        let n = nranks.unwrap_or(8);
        print_limits(n);
        if threads {
            return run_threads(n, reps);
        }
        // SAFETY: no other thread of this process exists yet that could read the environment.
        unsafe { std::env::set_var(T0_VAR, unix_us().to_string()) };
        let failed = launch::spawn_and_wait(n)?;
        return Ok(if failed == 0 {
            ExitCode::SUCCESS
        } else {
            eprintln!("mscclpp-perf: {failed} of {n} ranks failed");
            ExitCode::FAILURE
        });
    }
    let started = Instant::now();
    let t0 = std::env::var(T0_VAR)
        .ok()
        .and_then(|v| v.parse::<u128>().ok());
    let spawn_us = t0.map_or(0.0, |t0| unix_us().saturating_sub(t0) as f64);
    let boot = launch::bootstrap(&role)?;
    let fig = Figures {
        spawn_us,
        ..measure(&boot, started, t0, reps, true)?
    };

    let all = boot.all_gather(&fig.encode())?;
    if boot.rank() == 0 {
        let figs: Vec<Figures> = all
            .iter()
            .enumerate()
            .map(|(r, b)| Figures::decode(b, r))
            .collect::<Result<_>>()?;
        print_row(boot.nranks(), "procs", boot.schedule(), &figs);
        let mut per_host = std::collections::BTreeMap::<u32, usize>::new();
        for &h in boot.hosts() {
            *per_host.entry(h).or_default() += 1;
        }
        println!(
            "# hosts (learned at init): {}, ranks per host {:?}",
            per_host.len(),
            per_host.values().collect::<Vec<_>>()
        );
    }
    boot.barrier()?;
    Ok(ExitCode::SUCCESS)
}

fn run_threads(n: usize, reps: u32) -> Result<ExitCode> {
    let cfg = BootstrapConfig::from_env()?;
    // Every connection between two threads of one process costs a descriptor at each end; with
    // more ranks than cores the collectives take the binomial tree (about two links per rank),
    // and the rendezvous holds one connection per rank at the root.
    let need = 3 * n as u64;
    let have = limit("Max open files").unwrap_or(1024);
    println!("# threads: about {need} descriptors needed at the peak, the limit is {have}");
    let t0 = Instant::now();
    let (root, uid) = BootstrapRoot::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), n, &cfg)?;
    let uid: UniqueId = uid;
    let figs: Arc<std::sync::Mutex<Vec<Option<Figures>>>> =
        Arc::new(std::sync::Mutex::new(vec![None; n]));
    let mut handles = Vec::with_capacity(n);
    for r in 0..n {
        let cfg = cfg.clone();
        let figs = Arc::clone(&figs);
        let h = std::thread::Builder::new()
            .name(format!("rank-{r}"))
            .stack_size(512 << 10)
            .spawn(move || -> Result<()> {
                let started = Instant::now();
                let boot = Bootstrap::new(&uid, r, n, cfg)?;
                let f = measure(&boot, started, None, reps, false)?;
                figs.lock().unwrap_or_else(|p| p.into_inner())[r] = Some(f);
                // Nobody leaves before everyone measured: a leaving rank closes connections.
                boot.barrier()?;
                Ok(())
            })
            .map_err(|e| Error::io(format!("starting rank thread {r} of {n}"), e))?;
        handles.push(h);
    }
    let mut failed = 0;
    for (r, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failed += 1;
                if failed <= 5 {
                    eprintln!("mscclpp-perf: rank {r}: {e}");
                }
            }
            Err(_) => failed += 1,
        }
    }
    let _ = root.wait();
    let wall = t0.elapsed();
    if failed > 0 {
        eprintln!("mscclpp-perf: {failed} of {n} ranks failed");
        // What usually runs out first with thousands of threads in one process.
        eprintln!(
            "mscclpp-perf: each rank here takes one thread (and the process one bootstrap event \
             loop), each thread four memory mappings (stack, signal stack and their guards); \
             vm.max_map_count = {}; each rank about four descriptors (its listener, its \
             connections' ends)",
            read_num("/proc/sys/vm/max_map_count").map_or("?".into(), |v| v.to_string())
        );
        return Ok(ExitCode::FAILURE);
    }
    let figs: Vec<Figures> = figs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|f| f.unwrap_or_default())
        .collect();
    print_row(n, "threads", cfg.schedule, &figs);
    println!("# wall time {:.1} s", wall.as_secs_f64());
    Ok(ExitCode::SUCCESS)
}
