//! The shared-memory barrier (`shm`): order over many rounds, views across simulated hosts,
//! opting out, and failures — a rank whose connections end, one that leaves, one that hangs,
//! and real processes with one killed while the others wait.

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::tests::{cfg, localhost0, on_ranks};
use super::*;

thread_local! {
    static HOST: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The host identity a bootstrap made on this thread takes (see `local_host_id`).
pub(super) fn host_override() -> Option<String> {
    HOST.with(|h| h.borrow().clone())
}

fn set_host(h: &str) {
    HOST.with(|x| *x.borrow_mut() = Some(h.to_owned()));
}

/// `rounds` barriers on `b`, each checking that no rank passed it before every rank arrived and
/// none reached the next one's count early (`count` is shared by the view's ranks, one per
/// thread); every 7th round also an all-gather and a ring of sends, whose order must hold.
fn rounds(b: &Bootstrap, count: &AtomicUsize, rounds: usize, tag: u64) {
    let (r, n) = (b.rank(), b.nranks());
    for i in 0..rounds {
        if (r + i) % 5 == 0 {
            // A different last arriver from round to round.
            thread::sleep(Duration::from_micros(200));
        }
        count.fetch_add(1, Ordering::SeqCst);
        b.barrier().unwrap();
        let c = count.load(Ordering::SeqCst);
        assert!(
            c >= (i + 1) * n && c <= (i + 2) * n,
            "rank {r}, round {i}: count {c} outside [{}, {}]",
            (i + 1) * n,
            (i + 2) * n
        );
        if i % 7 == 3 {
            let all = b.all_gather(&[r as u8, i as u8]).unwrap();
            for (p, v) in all.iter().enumerate() {
                assert_eq!(v, &vec![p as u8, i as u8], "rank {r} round {i}");
            }
            b.send((r + 1) % n, tag, &[i as u8]).unwrap();
            assert_eq!(b.recv((r + n - 1) % n, tag).unwrap(), vec![i as u8]);
        }
    }
}

fn segment_gone(b: &Bootstrap) -> bool {
    !b.segment_path(&b.host_peers()).0.exists()
}

#[test]
fn shared_memory_barrier_keeps_order_over_many_rounds() {
    const N: usize = 12;
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    on_ranks(N, move |r| {
        let b = Bootstrap::new(&uid, r, N, cfg(30_000)).unwrap();
        assert!(!b.barrier_in_shared_memory(), "decided before any barrier");
        b.barrier().unwrap();
        assert!(b.barrier_in_shared_memory(), "rank {r}");
        // Unlinked as soon as every rank mapped it: nothing left behind.
        assert!(segment_gone(&b), "rank {r}: segment file still there");
        b.barrier().unwrap();
        rounds(&b, &count, 300, 9);
    });
}

/// Three hosts of four ranks and one of a single rank (host identities per thread): the
/// leaders' TCP barrier between hosts, views across and within hosts, a shrink that removes a
/// host's leader, and a view with one rank per host (no shared memory).
#[test]
fn views_across_hosts_each_get_their_own_barrier() {
    const N: usize = 13;
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let counts: Arc<Vec<AtomicUsize>> = Arc::new((0..8).map(|_| AtomicUsize::new(0)).collect());
    on_ranks(N, move |r| {
        let host = if r == 12 { 3 } else { r / 4 };
        set_host(&format!("test-host-{host}"));
        let b = Bootstrap::new(&uid, r, N, cfg(30_000)).unwrap();
        assert_eq!(b.host_peers().len(), if r == 12 { 1 } else { 4 });
        b.barrier().unwrap();
        assert!(b.barrier_in_shared_memory(), "rank {r}");
        rounds(&b, &counts[0], 60, 9);
        // Two halves, each across hosts.
        let half = b.split(Some((r / 7) as u32), r as u32).unwrap().unwrap();
        rounds(&half, &counts[1 + r / 7], 40, 9);
        assert!(half.barrier_in_shared_memory(), "rank {r}");
        assert!(segment_gone(&half), "rank {r}");
        // One view per host: a single host each, no leaders' exchange.
        let local = b.split(Some(host as u32), 0).unwrap().unwrap();
        rounds(&local, &counts[3 + host], 40, 9);
        assert_eq!(local.barrier_in_shared_memory(), host != 3, "rank {r}");
        // One rank per host: nothing to share.
        let spread = b.split(Some((r % 4) as u32), r as u32).unwrap().unwrap();
        spread.barrier().unwrap();
        if r % 4 == 0 {
            assert!(!spread.barrier_in_shared_memory(), "rank {r}");
        }
        // The parent still works between its views' barriers.
        rounds(&b, &counts[7], 20, 10);
        // Without host 1's leader (rank 4): rank 5 leads host 1 now.
        if let Some(s) = b.shrink(&[4]).unwrap() {
            for _ in 0..30 {
                s.barrier().unwrap();
            }
            assert!(s.barrier_in_shared_memory(), "rank {r}");
        }
    });
}

#[test]
fn a_rank_that_opts_out_keeps_the_view_on_tcp() {
    const N: usize = 6;
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    on_ranks(N, move |r| {
        let c = BootstrapConfig {
            shared_memory: r != 3,
            ..cfg(30_000)
        };
        let b = Bootstrap::new(&uid, r, N, c).unwrap();
        b.barrier().unwrap();
        assert!(!b.barrier_in_shared_memory(), "rank {r}");
        assert!(
            segment_gone(&b),
            "rank {r}: the leader's segment was not removed"
        );
        rounds(&b, &count, 30, 9);
        // Views inherit the configuration: still on TCP.
        let v = b.split(Some(0), 0).unwrap().unwrap();
        v.barrier().unwrap();
        assert!(!v.barrier_in_shared_memory(), "rank {r}");
    });
}

/// A rank whose connections end as in a crash (its mapping stays: only the TCP side tells) while
/// the others wait in the shared-memory barrier, on one host and, with hosts, a leader.
#[test]
fn a_crash_fails_every_shared_memory_waiter_naming_it() {
    for (victim, hosts) in [(5usize, 1usize), (4, 3)] {
        const N: usize = 9;
        let uid = UniqueId::with_root(localhost0()).unwrap();
        let results = on_ranks(N, move |r| {
            set_host(&format!("crash-host-{}", r % hosts));
            let b = Bootstrap::new(&uid, r, N, cfg(30_000)).unwrap();
            b.barrier().unwrap();
            assert!(b.barrier_in_shared_memory());
            if r == victim {
                thread::sleep(Duration::from_millis(300));
                b.sever();
                thread::sleep(Duration::from_millis(3000));
                return None;
            }
            let t = Instant::now();
            let e = b.barrier().unwrap_err();
            let e2 = b.barrier().unwrap_err();
            Some((r, e, e2, t.elapsed()))
        });
        for (r, e, e2, took) in results.into_iter().flatten() {
            assert!(
                matches!(e, Error::Remote { rank, .. } if rank == victim),
                "{hosts} hosts, rank {r}: {e}"
            );
            assert!(e.to_string().contains("connection lost"), "rank {r}: {e}");
            assert!(
                matches!(e2, Error::Remote { rank, .. } if rank == victim),
                "rank {r}, later: {e2}"
            );
            assert!(took < Duration::from_secs(3), "rank {r}: {took:?}: {e}");
        }
    }
}

#[test]
fn a_rank_that_leaves_fails_the_waiters_naming_it() {
    const N: usize = 5;
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let results = on_ranks(N, move |r| {
        let b = Bootstrap::new(&uid, r, N, cfg(30_000)).unwrap();
        b.barrier().unwrap();
        assert!(b.barrier_in_shared_memory());
        if r == 2 {
            thread::sleep(Duration::from_millis(300));
            drop(b);
            return None;
        }
        let t = Instant::now();
        let e = b.barrier().unwrap_err();
        Some((r, e, t.elapsed()))
    });
    for (r, e, took) in results.into_iter().flatten() {
        assert!(matches!(e, Error::Remote { rank: 2, .. }), "rank {r}: {e}");
        assert!(took < Duration::from_secs(3), "rank {r}: {took:?}: {e}");
    }
}

#[test]
fn a_hung_rank_times_the_waiters_out_naming_it() {
    const N: usize = 4;
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let results = on_ranks(N, move |r| {
        let b = Bootstrap::new(&uid, r, N, cfg(1_500)).unwrap();
        b.barrier().unwrap();
        assert!(b.barrier_in_shared_memory());
        if r == 2 {
            thread::sleep(Duration::from_millis(2_500));
            return None;
        }
        let t = Instant::now();
        let e = b.barrier().unwrap_err();
        Some((r, e, t.elapsed()))
    });
    for (r, e, took) in results.into_iter().flatten() {
        assert!(matches!(e, Error::Timeout { .. }), "rank {r}: {e}");
        assert!(e.to_string().contains("[2]"), "rank {r}: {e}");
        assert!(
            took >= Duration::from_millis(1_400) && took < Duration::from_millis(2_400),
            "rank {r}: {took:?}"
        );
    }
}

// --- Ranks as processes: this test binary run again, one rank per process. ---

const ROLE: &str = "MSCCLPP_SHMTEST_ROLE";

fn child_env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} unset in a test child"))
}

/// A rank process: joins, runs barriers, says whether they ran in shared memory, and then either
/// stops taking part (the victim) or waits in a barrier until that fails.
fn child_rank() {
    let uid: UniqueId = child_env("MSCCLPP_SHMTEST_UID").parse().unwrap();
    let rank: usize = child_env("MSCCLPP_SHMTEST_RANK").parse().unwrap();
    let n: usize = child_env("MSCCLPP_SHMTEST_N").parse().unwrap();
    let victim: Option<usize> = std::env::var("MSCCLPP_SHMTEST_VICTIM")
        .ok()
        .and_then(|v| v.parse().ok());
    let out = PathBuf::from(child_env("MSCCLPP_SHMTEST_OUT"));
    let say = |line: String| {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&out)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    };
    let c = match BootstrapConfig::from_env() {
        Ok(c) => c,
        Err(e) => {
            say(format!("CONFIG {e}"));
            return;
        }
    };
    let b = Bootstrap::new(&uid, rank, n, c).unwrap();
    for i in 0..200 {
        b.barrier().unwrap();
        if i % 50 == 0 {
            let all = b.all_gather(&[rank as u8]).unwrap();
            assert_eq!(all.len(), n);
        }
    }
    say(format!("SHM {}", b.barrier_in_shared_memory()));
    let Some(v) = victim else {
        b.barrier().unwrap();
        say("DONE".into());
        return;
    };
    say("READY".into());
    if rank == v {
        thread::sleep(Duration::from_secs(60));
        return;
    }
    let e = b.barrier().unwrap_err();
    say(format!(
        "ERR {} {}",
        unix_ms(),
        e.to_string().replace('\n', " ")
    ));
    // Stay a moment, so that the others hear of the victim rather than of this rank's exit.
    thread::sleep(Duration::from_millis(500));
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

struct Job {
    children: Vec<std::process::Child>,
    _root: BootstrapRoot,
    outs: Vec<PathBuf>,
    dir: PathBuf,
}

impl Job {
    /// Starts `n` rank processes; `env(rank)` adds variables to one rank.
    fn start(
        name: &str,
        n: usize,
        victim: Option<usize>,
        env: impl Fn(usize) -> Vec<(String, String)>,
    ) -> Job {
        let dir =
            std::env::temp_dir().join(format!("mscclpp-shmtest-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let c = cfg(30_000);
        let (root, uid) = BootstrapRoot::start(localhost0(), n, &c).unwrap();
        let mut children = Vec::new();
        let mut outs = Vec::new();
        for r in 0..n {
            let out = dir.join(format!("rank-{r}"));
            let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
            cmd.args([
                "--exact",
                "shm_tests::shared_memory_barrier_across_processes",
                "--nocapture",
            ])
            .env(ROLE, "rank")
            .env("MSCCLPP_SHMTEST_UID", uid.to_string())
            .env("MSCCLPP_SHMTEST_RANK", r.to_string())
            .env("MSCCLPP_SHMTEST_N", n.to_string())
            .env("MSCCLPP_SHMTEST_OUT", &out)
            .env("MSCCLPP_BOOTSTRAP_TIMEOUT", "30")
            .env_remove("MSCCLPP_BOOTSTRAP_SHM")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
            if let Some(v) = victim {
                cmd.env("MSCCLPP_SHMTEST_VICTIM", v.to_string());
            }
            for (k, v) in env(r) {
                cmd.env(k, v);
            }
            children.push(cmd.spawn().unwrap());
            outs.push(out);
        }
        Job {
            children,
            _root: root,
            outs,
            dir,
        }
    }

    fn lines(&self, r: usize) -> Vec<String> {
        std::fs::read_to_string(&self.outs[r])
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Waits until every rank but `skip` wrote a line starting with `what`, or `limit` passed.
    fn wait_for(&self, what: &str, skip: Option<usize>, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if (0..self.outs.len())
                .filter(|&r| Some(r) != skip)
                .all(|r| self.lines(r).iter().any(|l| l.starts_with(what)))
            {
                return true;
            }
            thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn line(&self, r: usize, what: &str) -> Option<String> {
        self.lines(r).into_iter().find(|l| l.starts_with(what))
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// No segment of ours stays in `/dev/shm` (tests running beside this one may hold theirs for
/// the milliseconds of a set-up: looked at again for a while).
fn assert_no_segment_left(before: &[String]) {
    let mut new = Vec::new();
    for _ in 0..50 {
        new = shm_names()
            .into_iter()
            .filter(|n| !before.contains(n))
            .collect();
        if new.is_empty() {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
    panic!("segments left in /dev/shm: {new:?}");
}

fn shm_names() -> Vec<String> {
    std::fs::read_dir(Path::new("/dev/shm"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("mscclpp-bs-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Six rank processes: barriers in shared memory; `MSCCLPP_BOOTSTRAP_SHM=0` on one rank keeps
/// them all on TCP; a malformed value is an error naming the variable; one rank killed while
/// the others wait in the shared-memory barrier fails every survivor naming it, within seconds.
#[test]
fn shared_memory_barrier_across_processes() {
    if std::env::var(ROLE).is_ok() {
        child_rank();
        return;
    }
    const N: usize = 6;
    let before = shm_names();
    let limit = Duration::from_secs(60);

    let job = Job::start("plain", N, None, |_| Vec::new());
    assert!(job.wait_for("DONE", None, limit), "ranks did not finish");
    for r in 0..N {
        assert_eq!(job.line(r, "SHM").as_deref(), Some("SHM true"), "rank {r}");
    }
    drop(job);

    let job = Job::start("optout", N, None, |r| {
        if r == 2 {
            vec![("MSCCLPP_BOOTSTRAP_SHM".into(), "0".into())]
        } else {
            Vec::new()
        }
    });
    assert!(job.wait_for("DONE", None, limit), "ranks did not finish");
    for r in 0..N {
        assert_eq!(job.line(r, "SHM").as_deref(), Some("SHM false"), "rank {r}");
    }
    drop(job);

    let job = Job::start("malformed", 1, None, |_| {
        vec![("MSCCLPP_BOOTSTRAP_SHM".into(), "maybe".into())]
    });
    assert!(
        job.wait_for("CONFIG", None, limit),
        "no configuration error"
    );
    let e = job.line(0, "CONFIG").unwrap_or_default();
    assert!(e.contains("MSCCLPP_BOOTSTRAP_SHM"), "{e}");
    drop(job);

    const VICTIM: usize = 3;
    let mut job = Job::start("kill", N, Some(VICTIM), |_| Vec::new());
    assert!(
        job.wait_for("READY", None, limit),
        "ranks did not get ready"
    );
    // Let the survivors go to sleep in the barrier the victim never joins.
    thread::sleep(Duration::from_millis(300));
    let killed = unix_ms();
    job.children[VICTIM].kill().unwrap();
    assert!(
        job.wait_for("ERR", Some(VICTIM), Duration::from_secs(20)),
        "survivors did not all fail"
    );
    for r in (0..N).filter(|&r| r != VICTIM) {
        let l = job.line(r, "ERR").unwrap_or_default();
        let mut w = l.splitn(3, ' ').skip(1);
        let at: u128 = w.next().and_then(|t| t.parse().ok()).unwrap_or(u128::MAX);
        let msg = w.next().unwrap_or_default();
        assert!(
            msg.contains(&format!("rank {VICTIM}")) && msg.contains("connection lost"),
            "rank {r}: {msg}"
        );
        let took = at.saturating_sub(killed);
        assert!(took < 5_000, "rank {r} took {took} ms: {msg}");
    }
    drop(job);
    assert_no_segment_left(&before);
}
