//! Bootstrap with ranks as separate processes on loopback: collectives, refusal of a wrong
//! secret, a rank killed during a barrier, a rank that hangs.
//! Runs with `cargo test -p mscclpp-conformance --test bootstrap`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};
use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot, UniqueId};
use mscclpp_conformance::multiproc::{self, ChildOutcome};

const UID_VAR: &str = "MSCCLPP_TEST_UID";
const DIR_VAR: &str = "MSCCLPP_TEST_DIR";

fn cfg_from_env() -> BootstrapConfig {
    BootstrapConfig::from_env().expect("bootstrap config")
}

fn child_boot() -> Result<Bootstrap, String> {
    let (rank, n) = multiproc::rank_and_size();
    let uid: UniqueId = std::env::var(UID_VAR)
        .map_err(|_| "no uid".to_string())?
        .parse()
        .map_err(|e| format!("uid: {e}"))?;
    Bootstrap::new(&uid, rank, n, cfg_from_env()).map_err(|e| e.to_string())
}

fn mark_joined(rank: usize) {
    if let Ok(dir) = std::env::var(DIR_VAR) {
        let _ = std::fs::write(PathBuf::from(dir).join(format!("joined-{rank}")), b"");
    }
}

/// Rank body of `eight_ranks_collectives_and_send_recv`.
fn role_collectives() -> Result<(), String> {
    let b = child_boot()?;
    let (r, n) = (b.rank(), b.nranks());
    // all_gather with a different length per rank
    let mine: Vec<u8> = (0..(r * 37 + 1)).map(|i| (i as u8) ^ (r as u8)).collect();
    let all = b.all_gather(&mine).map_err(|e| e.to_string())?;
    for (p, got) in all.iter().enumerate() {
        let expect: Vec<u8> = (0..(p * 37 + 1)).map(|i| (i as u8) ^ (p as u8)).collect();
        if *got != expect {
            return Err(format!(
                "all_gather: rank {p}'s contribution wrong on rank {r}"
            ));
        }
    }
    b.barrier().map_err(|e| e.to_string())?;
    // every rank sends to every other on two tags; receive in the opposite order
    for p in (0..n).filter(|&p| p != r) {
        for tag in [11u64, 12] {
            let msg = format!("{r}->{p}#{tag}");
            b.send(p, tag, msg.as_bytes()).map_err(|e| e.to_string())?;
        }
    }
    for p in (0..n).rev().filter(|&p| p != r) {
        for tag in [12u64, 11] {
            let got = b.recv(p, tag).map_err(|e| e.to_string())?;
            if got != format!("{p}->{r}#{tag}").as_bytes() {
                return Err(format!(
                    "recv from {p} tag {tag}: {:?}",
                    String::from_utf8_lossy(&got)
                ));
            }
        }
    }
    let data = b
        .broadcast(5 % n, b"from five")
        .map_err(|e| e.to_string())?;
    if data != b"from five" {
        return Err("broadcast payload wrong".into());
    }
    for _ in 0..50 {
        b.barrier().map_err(|e| e.to_string())?;
    }
    multiproc::report("collectives", "ok");
    Ok(())
}

/// A process that holds a UniqueId with the right address but a wrong secret.
fn role_impostor() -> Result<(), String> {
    let good: UniqueId = std::env::var(UID_VAR)
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|e: mscclpp::Error| e.to_string())?;
    let bytes = good.to_bytes();
    // Find a byte whose change keeps the id valid and pointing at the same root: the secret.
    let bad = (0..bytes.len())
        .find_map(|i| {
            let mut b = bytes;
            b[i] ^= 0x5A;
            UniqueId::from_bytes(&b)
                .ok()
                .filter(|u| u.root_addr() == good.root_addr() && *u != good)
        })
        .ok_or("no secret byte found in the id")?;
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(5),
        ..cfg_from_env()
    };
    match Bootstrap::new(&bad, 0, 2, cfg) {
        Ok(_) => Err("impostor was admitted".into()),
        Err(e) => {
            multiproc::report("refused", e.to_string().replace('\n', " "));
            Ok(())
        }
    }
}

/// Barriers until something fails; one rank (`MSCCLPP_TEST_HANG`) stops taking part instead.
fn role_barrier_loop() -> Result<(), String> {
    let b = child_boot()?;
    mark_joined(b.rank());
    let hang: Option<usize> = std::env::var("MSCCLPP_TEST_HANG")
        .ok()
        .and_then(|v| v.parse().ok());
    if hang == Some(b.rank()) {
        std::thread::sleep(Duration::from_secs(120));
        return Ok(());
    }
    let start = Instant::now();
    loop {
        if let Err(e) = b.barrier() {
            multiproc::report("error", e.to_string().replace('\n', " "));
            multiproc::report("failed_at_unix_us", unix_us());
            // Stay connected a moment, so that the other survivors learn of the original
            // failure rather than of this rank's exit.
            std::thread::sleep(Duration::from_millis(500));
            return Err(e.to_string());
        }
        if start.elapsed() > Duration::from_secs(100) {
            return Err("barriers kept succeeding".into());
        }
    }
}

fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

fn start_root(n: usize, timeout_s: u64) -> (BootstrapRoot, Vec<(String, String)>) {
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(timeout_s),
        ..BootstrapConfig::default()
    };
    let (root, uid) =
        BootstrapRoot::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), n, &cfg).expect("root");
    let env = vec![
        (UID_VAR.to_string(), uid.to_string()),
        (
            "MSCCLPP_BOOTSTRAP_TIMEOUT".to_string(),
            timeout_s.to_string(),
        ),
    ];
    (root, env)
}

fn all_ok(outs: &[ChildOutcome]) -> Result<(), Failed> {
    for o in outs {
        if !o.ok() {
            return Err(o.describe().into());
        }
    }
    Ok(())
}

fn eight_ranks_collectives_and_send_recv() -> Result<(), Failed> {
    let (_root, env) = start_root(8, 30);
    let outs = multiproc::spawn_ranks("boot-collectives", 8, &env, Duration::from_secs(60));
    all_ok(&outs)?;
    for o in &outs {
        if o.reports().get("collectives").map(String::as_str) != Some("ok") {
            return Err(format!("rank {} did not report", o.rank).into());
        }
    }
    Ok(())
}

fn wrong_secret_is_refused() -> Result<(), Failed> {
    let (_root, env) = start_root(2, 20);
    // The impostor goes first, while the root is still waiting for everyone; the legitimate
    // ranks must then still complete.
    let deadline = Instant::now() + Duration::from_secs(40);
    let imp = multiproc::wait(multiproc::spawn("boot-impostor", 0, 2, &env), deadline);
    let ranks: Vec<_> = (0..2)
        .map(|r| multiproc::spawn("boot-collectives", r, 2, &env))
        .collect();
    let outs: Vec<_> = ranks
        .into_iter()
        .map(|c| multiproc::wait(c, deadline))
        .collect();
    all_ok(&outs)?;
    if !imp.ok() {
        return Err(imp.describe().into());
    }
    let why = imp.reports().get("refused").cloned().unwrap_or_default();
    if !why.to_lowercase().contains("secret") {
        return Err(format!("refusal does not mention the secret: {why}").into());
    }
    eprintln!("    impostor refused: {why}");
    Ok(())
}

fn killed_rank_fails_the_others_within_the_deadline() -> Result<(), Failed> {
    const N: usize = 8;
    const VICTIM: usize = 3;
    const DEADLINE_S: u64 = 10;
    let dir = std::env::temp_dir().join(format!("mscclpp-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (_root, mut env) = start_root(N, DEADLINE_S);
    env.push((DIR_VAR.to_string(), dir.display().to_string()));
    let mut children: Vec<_> = (0..N)
        .map(|r| multiproc::spawn("boot-barrier-loop", r, N, &env))
        .collect();
    let joined_by = Instant::now() + Duration::from_secs(30);
    while (0..N).any(|r| !dir.join(format!("joined-{r}")).exists()) {
        if Instant::now() > joined_by {
            children.iter_mut().for_each(|c| c.kill());
            return Err("ranks did not all join within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200)); // let them get into barriers
    children[VICTIM].kill();
    let killed_at = unix_us();
    let deadline = Instant::now() + Duration::from_secs(DEADLINE_S * 3);
    let mut worst = Duration::ZERO;
    let mut naming_victim = 0;
    for (r, c) in children.into_iter().enumerate() {
        let o = multiproc::wait(c, deadline);
        if r == VICTIM {
            continue;
        }
        if o.timed_out || o.code == Some(0) {
            return Err(format!(
                "rank {r} did not fail after rank {VICTIM} was killed:\n{}",
                o.describe()
            )
            .into());
        }
        let err = o.reports().get("error").cloned().unwrap_or_default();
        // A survivor whose barrier had already received the victim's message fails on the next
        // peer still missing — possibly another survivor that failed first and left. Every error
        // must be a lost connection; at least one must name the victim (checked below).
        if !err.contains("connection lost") {
            return Err(format!("rank {r}'s error is not a lost connection: {err}").into());
        }
        if err.contains(&format!("rank {VICTIM}")) {
            naming_victim += 1;
        }
        let failed_at: u128 = o
            .reports()
            .get("failed_at_unix_us")
            .and_then(|v| v.parse().ok())
            .unwrap_or(u128::MAX);
        let noticed =
            Duration::from_micros(failed_at.saturating_sub(killed_at).min(u64::MAX as u128) as u64);
        worst = worst.max(noticed);
    }
    let _ = std::fs::remove_dir_all(&dir);
    if naming_victim == 0 {
        return Err(format!("no survivor's error names rank {VICTIM}").into());
    }
    eprintln!(
        "    all {} survivors failed within {worst:?} of the kill (deadline {DEADLINE_S} s); {naming_victim} name rank {VICTIM}",
        N - 1
    );
    if worst >= Duration::from_secs(DEADLINE_S) {
        return Err(format!("survivors took {worst:?}, past the {DEADLINE_S} s deadline").into());
    }
    Ok(())
}

fn hung_rank_times_out_the_others() -> Result<(), Failed> {
    const N: usize = 4;
    const DEADLINE_S: u64 = 2;
    let (_root, mut env) = start_root(N, DEADLINE_S);
    env.push(("MSCCLPP_TEST_HANG".to_string(), "1".to_string()));
    let mut children: Vec<_> = (0..N)
        .map(|r| multiproc::spawn("boot-barrier-loop", r, N, &env))
        .collect();
    let hung = children.remove(1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| multiproc::wait(c, deadline))
        .collect();
    let mut hung = hung;
    hung.kill();
    for o in &outs {
        let err = o.reports().get("error").cloned().unwrap_or_default();
        if o.timed_out || o.code == Some(0) || !err.contains("timed out") {
            return Err(format!("rank {} did not time out:\n{}", o.rank, o.describe()).into());
        }
    }
    let slowest = outs.iter().map(|o| o.elapsed).max().unwrap_or_default();
    eprintln!(
        "    survivors timed out; slowest exited {slowest:?} after spawn (deadline {DEADLINE_S} s)"
    );
    Ok(())
}

fn main() {
    multiproc::run_child(|role| match role {
        "boot-collectives" => role_collectives(),
        "boot-impostor" => role_impostor(),
        "boot-barrier-loop" => role_barrier_loop(),
        other => Err(format!("unknown role {other}")),
    });
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![
        Trial::test(
            "bootstrap::eight_ranks_collectives_and_send_recv",
            eight_ranks_collectives_and_send_recv,
        ),
        Trial::test(
            "bootstrap::wrong_secret_is_refused",
            wrong_secret_is_refused,
        ),
        Trial::test(
            "bootstrap::killed_rank_fails_the_others_within_the_deadline",
            killed_rank_fails_the_others_within_the_deadline,
        ),
        Trial::test(
            "bootstrap::hung_rank_times_out_the_others",
            hung_rank_times_out_the_others,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
