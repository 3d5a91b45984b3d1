//! Connections between two ranks as separate processes, over each transport (CudaIpc and
//! Ethernet, the same cases stamped over both) on the host backend: ordering of data and token,
//! flush, a 64 MiB write, a peer killed mid-transfer, ranks with distinct host ids, and
//! Ethernet across two network namespaces. Runs with
//! `cargo test -p mscclpp-conformance --test transports`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libtest_mimic::{Completion, Failed, Trial};
use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot, UniqueId};
use mscclpp::hal::{BackendKind, DeviceBuffer, MemoryKind};
use mscclpp::transports::{
    AnyConnection, Connection, Endpoint, EndpointConfig, RegisteredMemory, Transport,
    TransportContext, TransportFlags, connect,
};
use mscclpp_conformance::multiproc::{self, ChildOutcome};
use mscclpp_conformance::rng::Rng;

const UID_VAR: &str = "MSCCLPP_TEST_UID";
const TRANSPORT_VAR: &str = "MSCCLPP_TEST_TRANSPORT";
const SEED_VAR: &str = "MSCCLPP_TEST_SEED";
const DIR_VAR: &str = "MSCCLPP_TEST_DIR";
const POISON: u8 = 0xA5;
/// How long a flush may take in the cases (far above what any of them needs).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(20);

type R<T> = Result<T, String>;

fn e2s(e: mscclpp::Error) -> String {
    e.to_string()
}

/// One rank of a case: its bootstrap, context and connection to the other rank.
struct Rank {
    boot: Bootstrap,
    ctx: Arc<TransportContext>,
    conn: AnyConnection,
    transport: Transport,
    seed: u64,
}

impl Rank {
    fn peer(&self) -> usize {
        1 - self.boot.rank()
    }

    /// Allocates `n` bytes filled with `fill`.
    fn alloc(&self, n: usize, fill: u8) -> R<DeviceBuffer> {
        let b = self
            .ctx
            .device()
            .alloc(n, MemoryKind::Device)
            .map_err(e2s)?;
        let s = self.ctx.device().create_stream().map_err(e2s)?;
        s.fill(&b.full(), fill).map_err(e2s)?;
        s.synchronize().map_err(e2s)?;
        Ok(b)
    }

    /// Registers `buf` (rank 1) and hands its descriptor to rank 0, which decodes it; each
    /// rank gets its view (rank 1 keeps its registration alive by holding it).
    fn share(&self, buf: Option<&DeviceBuffer>) -> R<RegisteredMemory> {
        let flags = TransportFlags::from(self.transport);
        let local = match buf {
            Some(b) => Some(RegisteredMemory::register(&self.ctx, &b.full(), flags).map_err(e2s)?),
            None => None,
        };
        let mine = local.as_ref().map(|m| m.to_bytes()).unwrap_or_default();
        let all = self.boot.all_gather(&mine).map_err(e2s)?;
        let theirs = RegisteredMemory::from_bytes(&self.ctx, &all[self.peer()]);
        match (local, theirs) {
            (Some(l), _) => Ok(l),
            (None, Ok(t)) => Ok(t),
            (None, Err(e)) => Err(format!("decoding the peer's memory: {e}")),
        }
    }
}

fn child_boot() -> R<Bootstrap> {
    let (rank, n) = multiproc::rank_and_size();
    let uid: UniqueId = std::env::var(UID_VAR)
        .map_err(|_| "no uid".to_string())?
        .parse()
        .map_err(|e| format!("uid: {e}"))?;
    let cfg = BootstrapConfig::from_env().map_err(e2s)?;
    Bootstrap::new(&uid, rank, n, cfg).map_err(e2s)
}

fn endpoint_cfg(t: Transport) -> EndpointConfig {
    let mut cfg = EndpointConfig::new(t);
    cfg.connect_timeout = Duration::from_secs(20);
    cfg
}

fn setup_with(boot: Bootstrap, t: Transport) -> R<Rank> {
    let backend = mscclpp::registry::probe(BackendKind::Host).map_err(e2s)?;
    let dev = backend.open_device(0).map_err(e2s)?;
    let ctx = TransportContext::new(boot.rank(), dev);
    let local = Endpoint::new(&ctx, endpoint_cfg(t)).map_err(e2s)?;
    let all = boot.all_gather(&local.to_bytes()).map_err(e2s)?;
    let remote = Endpoint::from_bytes(&all[1 - boot.rank()]).map_err(e2s)?;
    let conn = connect(local, &remote).map_err(e2s)?;
    let seed = std::env::var(SEED_VAR)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    Ok(Rank {
        boot,
        ctx,
        conn,
        transport: t,
        seed,
    })
}

fn setup() -> R<Rank> {
    let t: Transport = std::env::var(TRANSPORT_VAR)
        .map_err(|_| "no transport".to_string())?
        .parse()
        .map_err(e2s)?;
    setup_with(child_boot()?, t)
}

fn token(b: &DeviceBuffer, off: usize) -> R<u64> {
    let p = b.host_ptr().ok_or("host buffer without a host pointer")?;
    let p = p.wrapping_add(off);
    if p as usize % 8 != 0 || off + 8 > b.len() {
        return Err(format!(
            "token slot at {off} is misaligned or outside the buffer"
        ));
    }
    // SAFETY: an aligned 8-byte slot inside a live host-backend mapping (checked above); the
    // only writers store to it atomically.
    Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) }.load(Ordering::Acquire))
}

fn wait_token(b: &DeviceBuffer, off: usize, want: u64, limit: Duration) -> R<Duration> {
    let start = Instant::now();
    loop {
        let v = token(b, off)?;
        if v == want {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            return Err(format!(
                "token at {off} is {v}, expected {want} after {limit:?}"
            ));
        }
        std::hint::spin_loop();
    }
}

fn read_all(r: &Rank, b: &DeviceBuffer) -> R<Vec<u8>> {
    let mut out = vec![0u8; b.len()];
    let s = r.ctx.device().create_stream().map_err(e2s)?;
    s.read_to_host(&mut out, &b.full()).map_err(e2s)?;
    Ok(out)
}

fn compare(got: &[u8], want: &[u8], what: &str) -> R<()> {
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        return Err(format!(
            "{what}: first difference at byte {i}: got {:#04x}, expected {:#04x}",
            got[i], want[i]
        ));
    }
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} bytes, expected {}",
            got.len(),
            want.len()
        ));
    }
    Ok(())
}

/// Pieces `(offset, len)` within `n` bytes, the same on both ranks for one seed.
fn pieces(rng: &mut Rng, n: usize, count: usize) -> Vec<(usize, usize)> {
    (0..count)
        .map(|_| {
            let off = rng.below(n as u64 - 1) as usize;
            let len = 1 + rng.below((n - off).min(200_000) as u64) as usize;
            (off, len)
        })
        .collect()
}

const ORDER_N: usize = 1 << 20;
const ORDER_ROUNDS: u64 = 8;

/// Writes random pieces, then a token; the receiver, on seeing the token (no flush), finds all
/// the data it guards.
fn role_ordered(r: &Rank) -> R<()> {
    let me = r.boot.rank();
    let dst = (me == 1)
        .then(|| r.alloc(ORDER_N + 8, POISON))
        .transpose()?;
    if let Some(d) = &dst {
        // The token slot starts at zero, not poison.
        let s = r.ctx.device().create_stream().map_err(e2s)?;
        s.fill(&d.slice(ORDER_N..).map_err(e2s)?, 0).map_err(e2s)?;
        s.synchronize().map_err(e2s)?;
    }
    let dst_mem = r.share(dst.as_ref())?;
    let mut model = vec![POISON; ORDER_N];
    let src = if me == 0 {
        let b = r.alloc(ORDER_N, 0)?;
        Some((
            RegisteredMemory::register(&r.ctx, &b.full(), r.transport.into()).map_err(e2s)?,
            b,
        ))
    } else {
        None
    };
    let mut worst = Duration::ZERO;
    for round in 1..=ORDER_ROUNDS {
        let mut rng = Rng::new(r.seed ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let data = rng.bytes(ORDER_N);
        let ps = pieces(&mut rng, ORDER_N, 12);
        if let Some((src_mem, src_buf)) = &src {
            let s = r.ctx.device().create_stream().map_err(e2s)?;
            s.write_from_host(&src_buf.full(), &data).map_err(e2s)?;
            for &(off, len) in &ps {
                r.conn
                    .write(&dst_mem, off as u64, src_mem, off as u64, len as u64)
                    .map_err(e2s)?;
            }
            r.conn
                .update_and_sync(&dst_mem, ORDER_N as u64, round)
                .map_err(e2s)?;
        } else if let Some(d) = &dst {
            worst = worst.max(wait_token(d, ORDER_N, round, FLUSH_TIMEOUT)?);
            for &(off, len) in &ps {
                model[off..off + len].copy_from_slice(&data[off..off + len]);
            }
            let got = read_all(r, d)?;
            compare(&got[..ORDER_N], &model, &format!("round {round}"))?;
        }
        // The sender must not rewrite its source before the receiver has checked.
        r.boot.barrier().map_err(e2s)?;
    }
    r.conn.flush(FLUSH_TIMEOUT).map_err(e2s)?;
    if me == 1 {
        multiproc::report("token_wait_max_us", worst.as_micros());
    }
    multiproc::report("ordered", "ok");
    r.boot.barrier().map_err(e2s)
}

/// Several writes, then a flush; the receiver checks as soon as the sender says it flushed.
fn role_flush(r: &Rank) -> R<()> {
    let me = r.boot.rank();
    let n = 4 << 20;
    let dst = (me == 1).then(|| r.alloc(n, POISON)).transpose()?;
    let dst_mem = r.share(dst.as_ref())?;
    let mut rng = Rng::new(r.seed);
    let data = rng.bytes(n);
    let ps = pieces(&mut rng, n, 24);
    if me == 0 {
        let b = r.alloc(n, 0)?;
        let s = r.ctx.device().create_stream().map_err(e2s)?;
        s.write_from_host(&b.full(), &data).map_err(e2s)?;
        let src = RegisteredMemory::register(&r.ctx, &b.full(), r.transport.into()).map_err(e2s)?;
        let t0 = Instant::now();
        for &(off, len) in &ps {
            // Destination shifted from the source, to catch a mix-up of the two offsets.
            let dst_off = (off + 4096) % (n - len + 1);
            r.conn
                .write(&dst_mem, dst_off as u64, &src, off as u64, len as u64)
                .map_err(e2s)?;
        }
        r.conn.flush(FLUSH_TIMEOUT).map_err(e2s)?;
        multiproc::report("writes_and_flush_us", t0.elapsed().as_micros());
        r.boot.send(1, 7, b"flushed").map_err(e2s)?;
    } else if let Some(d) = &dst {
        r.boot.recv(0, 7).map_err(e2s)?;
        let mut model = vec![POISON; n];
        for &(off, len) in &ps {
            let dst_off = (off + 4096) % (n - len + 1);
            model[dst_off..dst_off + len].copy_from_slice(&data[off..off + len]);
        }
        compare(&read_all(r, d)?, &model, "after flush")?;
    }
    multiproc::report("flush", "ok");
    r.boot.barrier().map_err(e2s)
}

/// One 64 MiB write and a token, checked byte for byte.
fn role_large(r: &Rank) -> R<()> {
    const N: usize = 64 << 20;
    let me = r.boot.rank();
    let dst = (me == 1).then(|| r.alloc(N + 8, 0)).transpose()?;
    let dst_mem = r.share(dst.as_ref())?;
    let data = Rng::new(r.seed).bytes(N);
    if me == 0 {
        let b = r.alloc(N, 0)?;
        let s = r.ctx.device().create_stream().map_err(e2s)?;
        s.write_from_host(&b.full(), &data).map_err(e2s)?;
        let src = RegisteredMemory::register(&r.ctx, &b.full(), r.transport.into()).map_err(e2s)?;
        r.boot.barrier().map_err(e2s)?;
        let t0 = Instant::now();
        r.conn.write(&dst_mem, 0, &src, 0, N as u64).map_err(e2s)?;
        r.conn.update_and_sync(&dst_mem, N as u64, 1).map_err(e2s)?;
        r.conn.flush(FLUSH_TIMEOUT).map_err(e2s)?;
        let dt = t0.elapsed();
        multiproc::report("large_us", dt.as_micros());
        multiproc::report(
            "large_gbps",
            format!("{:.2}", N as f64 / dt.as_secs_f64() / 1e9),
        );
    } else if let Some(d) = &dst {
        r.boot.barrier().map_err(e2s)?;
        wait_token(d, N, 1, FLUSH_TIMEOUT)?;
        compare(&read_all(r, d)?[..N], &data, "64 MiB write")?;
    }
    multiproc::report("large", "ok");
    r.boot.barrier().map_err(e2s)
}

fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// Rank 0 writes and flushes in a loop; rank 1 waits to be killed. Rank 0 reports the error
/// and when it came.
fn role_killed(r: &Rank) -> R<()> {
    const N: usize = 1 << 20;
    let me = r.boot.rank();
    let dst = (me == 1).then(|| r.alloc(N, 0)).transpose()?;
    let dst_mem = r.share(dst.as_ref())?;
    let dir = PathBuf::from(std::env::var(DIR_VAR).map_err(|_| "no dir")?);
    if me == 1 {
        std::fs::write(dir.join("ready-1"), b"").map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_secs(120));
        return Err("rank 1 was not killed".into());
    }
    let b = r.alloc(N, 3)?;
    let src = RegisteredMemory::register(&r.ctx, &b.full(), r.transport.into()).map_err(e2s)?;
    std::fs::write(dir.join("ready-0"), b"").map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut rounds = 0u64;
    loop {
        let res = r
            .conn
            .write(&dst_mem, 0, &src, 0, N as u64)
            .and_then(|_| r.conn.flush(FLUSH_TIMEOUT));
        if let Err(e) = res {
            multiproc::report("failed_at_unix_us", unix_us());
            multiproc::report("error", e.to_string().replace('\n', " "));
            multiproc::report("rounds", rounds);
            return Ok(());
        }
        rounds += 1;
        if start.elapsed() > Duration::from_secs(60) {
            return Err("writes kept succeeding for 60 s".into());
        }
    }
}

/// Distinct host ids: CudaIpc is refused naming both ranks, Ethernet works.
fn role_distinct_hosts() -> R<()> {
    let boot = child_boot()?;
    let backend = mscclpp::registry::probe(BackendKind::Host).map_err(e2s)?;
    let dev = backend.open_device(0).map_err(e2s)?;
    let ctx = TransportContext::new(boot.rank(), dev);
    let local = Endpoint::new(&ctx, endpoint_cfg(Transport::CudaIpc)).map_err(e2s)?;
    let all = boot.all_gather(&local.to_bytes()).map_err(e2s)?;
    let remote = Endpoint::from_bytes(&all[1 - boot.rank()]).map_err(e2s)?;
    match connect(local, &remote) {
        Ok(_) => return Err("CudaIpc between distinct hosts was accepted".into()),
        Err(e) => multiproc::report("cudaipc_refused", e.to_string().replace('\n', " ")),
    }
    drop(ctx);
    let r = setup_with(boot, Transport::Ethernet)?;
    role_ordered(&r)
}

fn run_role(role: &str) -> R<()> {
    match role {
        "tr-ordered" => role_ordered(&setup()?),
        "tr-flush" => role_flush(&setup()?),
        "tr-large" => role_large(&setup()?),
        "tr-killed" => role_killed(&setup()?),
        "tr-distinct-hosts" => role_distinct_hosts(),
        other => Err(format!("unknown role {other}")),
    }
}

// ---------------------------------------------------------------------------------------------
// The parent side.

fn start_root(addr: IpAddr) -> (BootstrapRoot, Vec<(String, String)>, u64) {
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(30),
        ..BootstrapConfig::default()
    };
    let (root, uid) = BootstrapRoot::start(SocketAddr::new(addr, 0), 2, &cfg).expect("root");
    let (_, seed) = Rng::from_time();
    let env = vec![
        (UID_VAR.to_string(), uid.to_string()),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT".to_string(), "30".to_string()),
        (SEED_VAR.to_string(), seed.to_string()),
    ];
    (root, env, seed)
}

fn all_ok(outs: &[ChildOutcome], key: &str, seed: u64) -> Result<(), Failed> {
    for o in outs {
        if !o.ok() || o.reports().get(key).map(String::as_str) != Some("ok") {
            return Err(format!("seed {seed}: {}", o.describe()).into());
        }
    }
    Ok(())
}

fn run_case(t: Transport, role: &'static str, key: &'static str) -> Result<(), Failed> {
    let (_root, mut env, seed) = start_root(IpAddr::V4(Ipv4Addr::LOCALHOST));
    env.push((TRANSPORT_VAR.to_string(), t.to_string()));
    let outs = multiproc::spawn_ranks(role, 2, &env, Duration::from_secs(120));
    all_ok(&outs, key, seed)?;
    let rep: Vec<_> = outs.iter().map(ChildOutcome::reports).collect();
    for k in [
        "token_wait_max_us",
        "writes_and_flush_us",
        "large_us",
        "large_gbps",
    ] {
        if let Some(v) = rep.iter().find_map(|r| r.get(k)) {
            eprintln!("    {t} {role}: {k} = {v}");
        }
    }
    Ok(())
}

fn killed_peer(t: Transport) -> Result<(), Failed> {
    const DEADLINE: Duration = Duration::from_secs(5);
    let dir = std::env::temp_dir().join(format!("mscclpp-tr-kill-{}-{t}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (_root, mut env, _) = start_root(IpAddr::V4(Ipv4Addr::LOCALHOST));
    env.push((TRANSPORT_VAR.to_string(), t.to_string()));
    env.push((DIR_VAR.to_string(), dir.display().to_string()));
    let mut kids: Vec<_> = (0..2)
        .map(|r| multiproc::spawn("tr-killed", r, 2, &env))
        .collect();
    let ready_by = Instant::now() + Duration::from_secs(30);
    while !(dir.join("ready-0").exists() && dir.join("ready-1").exists()) {
        if Instant::now() > ready_by {
            kids.iter_mut().for_each(|k| k.kill());
            let outs: Vec<_> = kids
                .into_iter()
                .map(|k| multiproc::wait(k, Instant::now()).describe())
                .collect();
            return Err(format!("ranks not ready within 30 s:\n{}", outs.join("\n")).into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200)); // mid-transfer
    let mut victim = kids.remove(1);
    victim.kill();
    let killed_at = unix_us();
    let _ = multiproc::wait(victim, Instant::now() + Duration::from_secs(5));
    let o = multiproc::wait(kids.remove(0), Instant::now() + DEADLINE * 4);
    let _ = std::fs::remove_dir_all(&dir);
    let rep = o.reports();
    let err = rep.get("error").cloned().unwrap_or_default();
    if !o.ok() || !err.contains("rank 1") {
        return Err(format!(
            "survivor did not fail naming rank 1: {err:?}\n{}",
            o.describe()
        )
        .into());
    }
    let failed_at: u128 = rep
        .get("failed_at_unix_us")
        .and_then(|v| v.parse().ok())
        .unwrap_or(u128::MAX);
    let noticed = Duration::from_micros(failed_at.saturating_sub(killed_at) as u64);
    eprintln!(
        "    {t}: survivor failed {noticed:?} after the kill ({} write+flush rounds before): {err}",
        rep.get("rounds").map_or("?", String::as_str)
    );
    if noticed > DEADLINE {
        return Err(format!("survivor took {noticed:?}, past {DEADLINE:?}").into());
    }
    Ok(())
}

fn distinct_host_ids() -> Result<(), Failed> {
    let (_root, env, seed) = start_root(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let kids: Vec<_> = (0..2)
        .map(|r| {
            let mut env = env.clone();
            env.push(("MSCCLPP_HOSTID".to_string(), format!("test-host-{r}")));
            multiproc::spawn("tr-distinct-hosts", r, 2, &env)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| multiproc::wait(k, deadline))
        .collect();
    all_ok(&outs, "ordered", seed)?;
    for o in &outs {
        let why = o
            .reports()
            .get("cudaipc_refused")
            .cloned()
            .unwrap_or_default();
        if !(why.contains("rank 0") && why.contains("rank 1") && why.contains("test-host-")) {
            return Err(
                format!("rank {}'s refusal does not name both ranks: {why}", o.rank).into(),
            );
        }
        // The expected refusal, wrapped: one line ran to 210 characters.
        let head = format!("    rank {} refused CudaIpc:", o.rank);
        eprintln!("{}", mscclpp_conformance::harness::wrapped(&head, &why));
    }
    Ok(())
}

/// Runs `cmd`, failing with its output.
fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// A network namespace joined to this one by a veth pair (10.77.0.1 here, 10.77.0.2 there);
/// removed on drop.
struct Netns {
    name: String,
    veth: String,
}

impl Netns {
    fn create() -> Result<Netns, String> {
        let id = std::process::id() % 100_000;
        let ns = Netns {
            name: format!("mscclpp-tr-{id}"),
            veth: format!("mtr{id}a"),
        };
        let peer = format!("mtr{id}b");
        let (name, veth) = (ns.name.as_str(), ns.veth.as_str());
        sh(&["ip", "netns", "add", name])?;
        sh(&[
            "ip", "link", "add", veth, "type", "veth", "peer", "name", &peer,
        ])?;
        sh(&["ip", "link", "set", &peer, "netns", name])?;
        sh(&["ip", "addr", "add", "10.77.0.1/24", "dev", veth])?;
        sh(&["ip", "link", "set", veth, "up"])?;
        let inside = ["ip", "netns", "exec", name];
        for cmd in [
            &["ip", "addr", "add", "10.77.0.2/24", "dev", &peer][..],
            &["ip", "link", "set", &peer, "up"],
            &["ip", "link", "set", "lo", "up"],
        ] {
            sh(&[&inside[..], cmd].concat())?;
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh(&["ip", "link", "del", &self.veth]);
        let _ = sh(&["ip", "netns", "del", &self.name]);
    }
}

fn ethernet_across_namespaces() -> Result<Completion, Failed> {
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(why) => {
            return Ok(Completion::ignored_with(format!(
                "cannot make a network namespace here: {why}"
            )));
        }
    };
    let (_root, env, seed) = start_root(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)));
    let exe = std::env::current_exe()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut kids = Vec::new();
    for (rank, ip) in [(0usize, "10.77.0.1"), (1, "10.77.0.2")] {
        let mut cmd = if rank == 0 {
            Command::new(&exe)
        } else {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns.name]).arg(&exe);
            c
        };
        cmd.env(multiproc::ROLE_VAR, "tr-ordered")
            .env(multiproc::RANK_VAR, rank.to_string())
            .env(multiproc::NRANKS_VAR, "2")
            .env(TRANSPORT_VAR, "Ethernet")
            .env("MSCCLPP_SOCKET_IFNAME", ip)
            .env("MSCCLPP_HOSTID", format!("netns-host-{rank}"))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        kids.push(cmd.spawn()?);
    }
    let mut failures = Vec::new();
    for (rank, mut k) in kids.into_iter().enumerate() {
        while k.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = k.kill();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = k.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !stdout.contains("ordered=ok") {
            failures.push(format!(
                "rank {rank} ({}): {}\n{}",
                out.status,
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        } else if let Some(l) = stdout.lines().find(|l| l.contains("token_wait_max_us")) {
            eprintln!("    netns Ethernet rank {rank}: {l}");
        }
    }
    if !failures.is_empty() {
        return Err(format!("seed {seed}:\n{}", failures.join("\n")).into());
    }
    Ok(Completion::Completed)
}

fn main() {
    multiproc::run_child(run_role);
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = Vec::new();
    for t in [Transport::CudaIpc, Transport::Ethernet] {
        for (case, role, key) in [
            ("ordered_writes_then_token", "tr-ordered", "ordered"),
            ("several_writes_then_flush", "tr-flush", "flush"),
            ("large_write_64mib", "tr-large", "large"),
        ] {
            trials.push(Trial::test(format!("transports::{t}::{case}"), move || {
                run_case(t, role, key)
            }));
        }
        trials.push(Trial::test(
            format!("transports::{t}::killed_peer_fails_the_survivor"),
            move || killed_peer(t),
        ));
    }
    trials.push(Trial::test(
        "transports::distinct_host_ids_refuse_cudaipc_and_ethernet_works",
        distinct_host_ids,
    ));
    trials.push(Trial::ignorable_test(
        "transports::Ethernet::across_network_namespaces",
        ethernet_across_namespaces,
    ));
    libtest_mimic::run(&args, trials).exit();
}
