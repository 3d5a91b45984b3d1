//! Collectives across hosts on this machine: ranks as processes on the host backend, grouped
//! into "hosts" either by `MSCCLPP_HOSTID` per rank on loopback (always runs) or by network
//! namespaces joined by veth pairs and a bridge (needs root and `ip`; reported ignored with the
//! reason otherwise). Every collective, several types and operators, odd counts, in and out of
//! place, outputs poisoned before each call, against a CPU reference. Runs with
//! `cargo test -p mscclpp-conformance --test multinode`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::{Completion, Failed, Trial};
use mscclpp::collectives::{AnyCollectives, CollectiveCall, CollectiveKind, DEFAULT_SLOT_BYTES};
use mscclpp::comm::Communicator;
use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot, UniqueId};
use mscclpp::hal::{BackendKind, DataType, MemoryKind, ReduceOp};
use mscclpp::typed;
use mscclpp_conformance::multiproc::{self, ChildOutcome};
use mscclpp_conformance::netns::{NET, Namespaces};
use mscclpp_conformance::reference::{count_wrong, expected, random_input};
use mscclpp_conformance::rng::Rng;

const UID_VAR: &str = "MSCCLPP_TEST_UID";
const SEED_VAR: &str = "MSCCLPP_TEST_SEED";
const HOSTS_VAR: &str = "MSCCLPP_TEST_HOSTS";
const FULL_VAR: &str = "MSCCLPP_TEST_FULL";
const BACKEND_VAR: &str = "MSCCLPP_TEST_BACKEND";
const POISON: u8 = 0xA5;

type R<T> = Result<T, String>;

fn e2s(e: mscclpp::hal::Error) -> String {
    e.to_string()
}

/// The cases one rank runs: (kind, type, operator, count, in place).
fn cases(full: bool) -> Vec<(CollectiveKind, DataType, ReduceOp, usize, bool)> {
    let types: &[(DataType, ReduceOp)] = if full {
        &[
            (DataType::F32, ReduceOp::Sum),
            (DataType::I32, ReduceOp::Min),
            (DataType::BF16, ReduceOp::Sum),
            (DataType::U8, ReduceOp::Max),
            (DataType::F16, ReduceOp::Prod),
        ]
    } else {
        &[
            (DataType::F32, ReduceOp::Sum),
            (DataType::I32, ReduceOp::Max),
        ]
    };
    // Odd counts (uneven shards), a count the ranks per host divide, and counts that take
    // several inter-host rounds (the tests run with 4 KiB slots) and the sharded all-reduce
    // (above 8 KiB per rank here).
    let counts: &[usize] = if full {
        &[1, 7, 1001, 4096, 6001]
    } else {
        &[7, 1001, 6001]
    };
    let mut out = Vec::new();
    for kind in CollectiveKind::ALL {
        for &(dtype, op) in types {
            for &count in counts {
                for in_place in [false, true] {
                    out.push((kind, dtype, op, count, in_place));
                }
            }
        }
    }
    out
}

/// Every rank's input of case `case` (the same on every rank: each generates all of them).
fn inputs(seed: u64, case: usize, n: usize, elems: usize, dtype: DataType) -> Vec<Vec<u8>> {
    (0..n)
        .map(|r| {
            let mut rng = Rng::new(seed ^ ((case as u64) << 20) ^ r as u64);
            random_input(dtype, elems, &mut rng)
        })
        .collect()
}

fn child(role: &str) -> R<()> {
    match role {
        "hier" => {}
        "hier-dies" => return dies(),
        _ => return Err(format!("unknown role {role}")),
    }
    let (rank, n) = multiproc::rank_and_size();
    let get = |v: &str| std::env::var(v).map_err(|_| format!("{v} is not set"));
    let uid: UniqueId = get(UID_VAR)?.parse().map_err(|e| format!("uid: {e}"))?;
    let seed: u64 = get(SEED_VAR)?.parse().map_err(|e| format!("seed: {e}"))?;
    let (hosts, per_host) = get(HOSTS_VAR)?
        .split_once('x')
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
        .ok_or("bad host shape")?;
    let full = get(FULL_VAR).is_ok_and(|v| v == "1");
    let boot =
        Bootstrap::new(&uid, rank, n, BootstrapConfig::from_env().map_err(e2s)?).map_err(e2s)?;
    let kind = match std::env::var(BACKEND_VAR).as_deref() {
        Ok("cuda") => BackendKind::Cuda,
        Ok("rocm") => BackendKind::Rocm,
        _ => BackendKind::Host,
    };
    let backend = mscclpp::registry::probe(kind).map_err(e2s)?;
    // GPUs: rank r on device r % count (two ranks may share one).
    let device = backend
        .open_device(rank % backend.device_count().max(1))
        .map_err(e2s)?;
    let comm = Arc::new(Communicator::new(Arc::new(boot), device.clone()));
    let coll = typed::collectives(comm, DEFAULT_SLOT_BYTES)
        .map_err(|e| format!("the collectives: {e}"))?;
    if coll.hosts() != Some((hosts, per_host)) {
        return Err(format!(
            "the collectives see {:?} (hosts, ranks per host), expected {:?}",
            coll.hosts(),
            (hosts, per_host)
        ));
    }
    let stream = device.create_stream().map_err(e2s)?;
    let mut wrong_total = 0usize;
    let mut checked = 0usize;
    let mut failures = Vec::new();
    for (i, &(kind, dtype, op, count, in_place)) in cases(full).iter().enumerate() {
        let s = dtype.size();
        let (in_elems, out_elems) = kind.buffer_elements(count as u64, n as u64);
        let (in_elems, out_elems) = (in_elems as usize, out_elems as usize);
        let all = inputs(seed, i, n, in_elems, dtype);
        let root = i % n;
        let want = expected(kind, dtype, op, &all, rank, count, root);
        let mine = &all[rank];
        // The buffer the output is read from, and the call's slices.
        let (buf_bytes, in_off, out_off) = if !in_place {
            (0, 0, 0)
        } else {
            match kind {
                CollectiveKind::AllGather => (out_elems * s, rank * count * s, 0),
                CollectiveKind::ReduceScatter => (in_elems * s, 0, rank * count * s),
                _ => (in_elems * s, 0, 0),
            }
        };
        let (inb, outb);
        let (input, output) = if in_place {
            let b = device.alloc(buf_bytes, MemoryKind::Device).map_err(e2s)?;
            stream.fill(&b.full(), POISON).map_err(e2s)?;
            let input = b.slice(in_off..in_off + in_elems * s).map_err(e2s)?;
            stream.write_from_host(&input, mine).map_err(e2s)?;
            let output = b.slice(out_off..out_off + out_elems * s).map_err(e2s)?;
            inb = b;
            outb = None;
            (input, output)
        } else {
            let i = device
                .alloc(in_elems * s, MemoryKind::Device)
                .map_err(e2s)?;
            let o = device
                .alloc(out_elems * s, MemoryKind::Device)
                .map_err(e2s)?;
            stream.write_from_host(&i.full(), mine).map_err(e2s)?;
            stream.fill(&o.full(), POISON).map_err(e2s)?;
            let (input, output) = (i.full(), o.full());
            inb = i;
            outb = Some(o);
            (input, output)
        };
        let call = CollectiveCall::new(kind, &input, &output, count, dtype)
            .op(op)
            .root(root);
        let what = format!(
            "{} {dtype} {op:?} count {count} {} root {root}",
            kind.name(),
            if in_place { "in place" } else { "out of place" }
        );
        coll.run(&call, &*stream)
            .map_err(|e| format!("{what}: {e}"))?;
        stream
            .synchronize_timeout(Duration::from_secs(60))
            .map_err(|e| format!("{what}: {e}"))?;
        let mut got = vec![0u8; out_elems * s];
        stream.read_to_host(&mut got, &output).map_err(e2s)?;
        let wrong = count_wrong(dtype, op, &got, &want);
        if !in_place {
            let mut after = vec![0u8; in_elems * s];
            stream.read_to_host(&mut after, &input).map_err(e2s)?;
            if &after != mine {
                failures.push(format!("{what}: the input was modified"));
            }
        }
        if wrong > 0 {
            failures.push(format!("{what}: {wrong} of {count} elements wrong"));
        }
        wrong_total += wrong;
        checked += 1;
        drop((inb, outb));
    }
    if kind == BackendKind::Host {
        graphs(&*coll, &device, rank, n, per_host, seed).map_err(|e| format!("graphs: {e}"))?;
    }
    multiproc::report("cases", checked);
    multiproc::report("wrong", wrong_total);
    if !failures.is_empty() {
        return Err(failures.join("\n"));
    }
    multiproc::report("hier", "ok");
    Ok(())
}

/// A captured multi-host all-reduce replayed on new inputs (the kernels' semaphores continue
/// their counts), and a capture that would need a larger staging buffer refused with the reason.
fn graphs(
    coll: &dyn AnyCollectives,
    device: &Arc<dyn mscclpp::hal::Device>,
    rank: usize,
    n: usize,
    per_host: usize,
    seed: u64,
) -> R<()> {
    const COUNT: usize = 3001;
    let stream = device.create_stream().map_err(e2s)?;
    let buf = device.alloc(COUNT * 4, MemoryKind::Device).map_err(e2s)?;
    let b = buf.full();
    stream.begin_capture().map_err(e2s)?;
    let captured = coll.run(
        &CollectiveCall::new(CollectiveKind::AllReduce, &b, &b, COUNT, DataType::F32)
            .op(ReduceOp::Sum),
        &*stream,
    );
    let graph = stream.end_capture().map_err(e2s)?;
    captured.map_err(|e| format!("captured all-reduce: {e}"))?;
    for replay in 0..3 {
        let all = inputs(seed ^ 0x9e37, 1000 + replay, n, COUNT, DataType::F32);
        stream.write_from_host(&b, &all[rank]).map_err(e2s)?;
        graph.launch(&*stream).map_err(e2s)?;
        stream
            .synchronize_timeout(Duration::from_secs(60))
            .map_err(e2s)?;
        let mut got = vec![0u8; COUNT * 4];
        stream.read_to_host(&mut got, &b).map_err(e2s)?;
        let want = expected(
            CollectiveKind::AllReduce,
            DataType::F32,
            ReduceOp::Sum,
            &all,
            rank,
            COUNT,
            0,
        );
        let wrong = count_wrong(DataType::F32, ReduceOp::Sum, &got, &want);
        if wrong > 0 {
            return Err(format!(
                "replay {replay}: {wrong} of {COUNT} elements wrong"
            ));
        }
    }
    // More staging than any call so far has grown: refused inside a capture, on every rank
    // (with one rank per host the reduce-scatter needs none).
    let big = 1 << 16;
    let input = device.alloc(big * n * 4, MemoryKind::Device).map_err(e2s)?;
    let output = device.alloc(big * 4, MemoryKind::Device).map_err(e2s)?;
    stream.begin_capture().map_err(e2s)?;
    let res = coll.run(
        &CollectiveCall::new(
            CollectiveKind::ReduceScatter,
            &input.full(),
            &output.full(),
            big,
            DataType::F32,
        )
        .op(ReduceOp::Sum),
        &*stream,
    );
    let _ = stream.end_capture().map_err(e2s)?;
    match res {
        Err(e) if per_host > 1 && e.to_string().contains("capturing") => {}
        Ok(()) if per_host == 1 => {}
        other => {
            return Err(format!(
                "reduce-scatter growing its staging in a capture: {other:?}"
            ));
        }
    }
    multiproc::report("graphs", "ok");
    Ok(())
}

/// Two hosts of one rank: the last rank dies (SIGABRT, no goodbye) half a second after set-up,
/// while the first's all-reduce waits for it; that call must fail naming it, within the deadline.
fn dies() -> R<()> {
    let (rank, n) = multiproc::rank_and_size();
    let get = |v: &str| std::env::var(v).map_err(|_| format!("{v} is not set"));
    let uid: UniqueId = get(UID_VAR)?.parse().map_err(|e| format!("uid: {e}"))?;
    let boot =
        Bootstrap::new(&uid, rank, n, BootstrapConfig::from_env().map_err(e2s)?).map_err(e2s)?;
    let backend = mscclpp::registry::probe(BackendKind::Host).map_err(e2s)?;
    let device = backend.open_device(0).map_err(e2s)?;
    let comm = Arc::new(Communicator::new(Arc::new(boot), device.clone()));
    let coll = typed::collectives(comm, DEFAULT_SLOT_BYTES)
        .map_err(|e| format!("the collectives: {e}"))?;
    if rank == n - 1 {
        // Dies while the survivor's kernel waits for its signals.
        std::thread::sleep(Duration::from_millis(500));
        std::process::abort();
    }
    let stream = device.create_stream().map_err(e2s)?;
    let buf = device.alloc(1 << 20, MemoryKind::Device).map_err(e2s)?;
    let started = Instant::now();
    let res = coll
        .run(
            &CollectiveCall::new(
                CollectiveKind::AllReduce,
                &buf.full(),
                &buf.full(),
                1 << 18,
                DataType::F32,
            )
            .op(ReduceOp::Sum),
            &*stream,
        )
        .and_then(|()| stream.synchronize_timeout(Duration::from_secs(50)));
    let took = started.elapsed();
    match res {
        Ok(()) => Err("the all-reduce succeeded although its peer host died".into()),
        Err(e) => {
            let msg = e.to_string();
            multiproc::report("error", &msg);
            multiproc::report("error_ms", took.as_millis());
            if !msg.contains(&format!("rank {}", n - 1)) {
                return Err(format!("the error does not name the dead rank: {msg}"));
            }
            multiproc::report("hier", "ok");
            Ok(())
        }
    }
}

fn start_root(addr: IpAddr, n: usize) -> (BootstrapRoot, Vec<(String, String)>, u64) {
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(60),
        ..BootstrapConfig::default()
    };
    let (root, uid) = BootstrapRoot::start(SocketAddr::new(addr, 0), n, &cfg).expect("root");
    let (_, seed) = Rng::from_time();
    let env = vec![
        (UID_VAR.to_string(), uid.to_string()),
        (SEED_VAR.to_string(), seed.to_string()),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT".to_string(), "60".to_string()),
        ("MSCCLPP_HIER_SLOT_BYTES".to_string(), "4096".to_string()),
        // Both all-reduce paths: up to 8 KiB per rank the small one, above the sharded one.
        ("MSCCLPP_HIER_SMALL_BYTES".to_string(), "8192".to_string()),
    ];
    (root, env, seed)
}

fn judge(outs: &[ChildOutcome], seed: u64, what: &str) -> Result<Completion, Failed> {
    let bad: Vec<String> = outs
        .iter()
        .filter(|o| !o.ok() || o.reports().get("hier").map(String::as_str) != Some("ok"))
        .map(ChildOutcome::describe)
        .collect();
    if !bad.is_empty() {
        return Err(format!("{what}, seed {seed}:\n{}", bad.join("\n")).into());
    }
    let mut cases = 0;
    for o in outs {
        cases += o
            .reports()
            .get("cases")
            .and_then(|c| c.parse::<usize>().ok())
            .unwrap_or(0);
    }
    eprintln!(
        "    {what}: {} ranks, {cases} rank-cases, 0 wrong",
        outs.len()
    );
    Ok(Completion::Completed)
}

/// `hosts` hosts of `per_host` ranks, each rank with `MSCCLPP_HOSTID` naming its host, on
/// `backend` (ignored with the probe's reason where it is absent).
fn by_host_id(
    backend: BackendKind,
    hosts: usize,
    per_host: usize,
    full: bool,
    extra: Vec<(String, String)>,
) -> Result<Completion, Failed> {
    if let Err(e) = mscclpp::registry::probe(backend) {
        return Ok(Completion::ignored_with(
            mscclpp_conformance::harness::ignore_reason(e),
        ));
    }
    let n = hosts * per_host;
    let (_root, mut env, seed) = start_root(IpAddr::V4(Ipv4Addr::LOCALHOST), n);
    let over = extra
        .iter()
        .find(|(k, _)| k == "MSCCLPP_HIER_TRANSPORT")
        .map(|(_, v)| format!(" over {v}"))
        .unwrap_or_default();
    env.extend(extra);
    env.push((BACKEND_VAR.into(), backend.to_string()));
    env.push(("MSCCLPP_BACKEND".into(), backend.to_string()));
    let deadline = Instant::now() + Duration::from_secs(300);
    let kids: Vec<_> = (0..n)
        .map(|r| {
            let mut env = env.clone();
            env.push((HOSTS_VAR.into(), format!("{hosts}x{per_host}")));
            env.push((FULL_VAR.into(), if full { "1" } else { "0" }.into()));
            env.push((
                "MSCCLPP_HOSTID".into(),
                format!("hier-test-{}-host-{}", std::process::id(), r / per_host),
            ));
            multiproc::spawn("hier", r, n, &env)
        })
        .collect();
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| multiproc::wait(k, deadline))
        .collect();
    judge(
        &outs,
        seed,
        &format!("{backend}: {hosts} hosts x {per_host} ranks by MSCCLPP_HOSTID{over}"),
    )
}

/// A rank of the other host dies during a call: the survivor's call fails naming it, well
/// before the kernels' own deadline.
fn peer_host_dies(extra: Vec<(String, String)>) -> Result<(), Failed> {
    let (_root, mut env, seed) = start_root(IpAddr::V4(Ipv4Addr::LOCALHOST), 2);
    env.extend(extra);
    env.push(("MSCCLPP_BACKEND".into(), "host".into()));
    let deadline = Instant::now() + Duration::from_secs(120);
    let kids: Vec<_> = (0..2)
        .map(|r| {
            let mut env = env.clone();
            env.push((
                "MSCCLPP_HOSTID".into(),
                format!("hier-dies-{}-host-{r}", std::process::id()),
            ));
            multiproc::spawn("hier-dies", r, 2, &env)
        })
        .collect();
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| multiproc::wait(k, deadline))
        .collect();
    let survivor = &outs[0];
    let r = survivor.reports();
    if !survivor.ok() || r.get("hier").map(String::as_str) != Some("ok") {
        return Err(format!("seed {seed}: {}", survivor.describe()).into());
    }
    let ms: u64 = r
        .get("error_ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    if ms > 30_000 {
        return Err(format!("the survivor took {ms} ms to fail: {}", survivor.describe()).into());
    }
    // The expected error, wrapped to the width of the other lines.
    let head = format!("    survivor failed as expected, in {ms} ms:");
    eprintln!(
        "{}",
        mscclpp_conformance::harness::wrapped(
            &head,
            r.get("error").map(String::as_str).unwrap_or("?")
        )
    );
    Ok(())
}

/// `hosts` network namespaces of `per_host` ranks each (the host ids name the namespaces), with
/// `extra` in every rank's environment.
fn by_namespace(
    hosts: usize,
    per_host: usize,
    extra: Vec<(String, String)>,
) -> Result<Completion, Failed> {
    // One set of namespaces at a time: they share the bridge's name and subnet.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let ns = match Namespaces::create(hosts) {
        Ok(ns) => ns,
        Err(why) => {
            return Ok(Completion::ignored_with(format!(
                "cannot make network namespaces here (needs root and `ip`): {why}"
            )));
        }
    };
    let n = hosts * per_host;
    let root_ip: Ipv4Addr = format!("{NET}.254").parse().map_err(|_| "root address")?;
    let (_root, env, seed) = start_root(IpAddr::V4(root_ip), n);
    let deadline = Instant::now() + Duration::from_secs(300);
    let kids: Vec<_> = (0..n)
        .map(|r| {
            let h = r / per_host;
            let mut vars = vec![
                (HOSTS_VAR.to_string(), format!("{hosts}x{per_host}")),
                (FULL_VAR.to_string(), "0".to_string()),
                ("MSCCLPP_BACKEND".into(), "host".into()),
                ("MSCCLPP_SOCKET_IFNAME".into(), format!("{NET}.{}", h + 1)),
                // the fixture net plugin's address (it listens on loopback otherwise)
                ("FIXTURE_NET_IP".into(), format!("{NET}.{}", h + 1)),
            ];
            vars.extend(extra.iter().cloned());
            vars.push((
                "MSCCLPP_HOSTID".into(),
                format!("hier-netns-{}-{h}", std::process::id()),
            ));
            vars.extend(env.iter().cloned());
            multiproc::spawn_via(&["ip", "netns", "exec", &ns.names[h]], "hier", r, n, &vars)
        })
        .collect();
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| multiproc::wait(k, deadline))
        .collect();
    judge(
        &outs,
        seed,
        &format!("{hosts} network namespaces x {per_host} ranks"),
    )
}

/// `MSCCLPP_HIER_TRANSPORT=Net` with a plugin file that does not exist: every rank fails at
/// set-up with an error naming the file, within the deadline (no hang, no crash).
fn missing_plugin_is_named() -> Result<(), Failed> {
    let (_root, mut env, _seed) = start_root(IpAddr::V4(Ipv4Addr::LOCALHOST), 2);
    env.push(("MSCCLPP_BACKEND".into(), "host".into()));
    env.push((BACKEND_VAR.into(), "host".into()));
    env.push((HOSTS_VAR.into(), "2x1".into()));
    env.push((FULL_VAR.into(), "0".into()));
    env.push(("MSCCLPP_HIER_TRANSPORT".into(), "Net".into()));
    env.push((
        "NCCL_NET_PLUGIN".into(),
        "/nonexistent/libnccl-net-absent.so".into(),
    ));
    let deadline = Instant::now() + Duration::from_secs(90);
    let kids: Vec<_> = (0..2)
        .map(|r| {
            let mut env = env.clone();
            env.push((
                "MSCCLPP_HOSTID".into(),
                format!("net-missing-{}-host-{r}", std::process::id()),
            ));
            multiproc::spawn("hier", r, 2, &env)
        })
        .collect();
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| multiproc::wait(k, deadline))
        .collect();
    for o in &outs {
        let text = o.describe();
        if o.ok() {
            return Err(format!("a rank succeeded without its net plugin: {text}").into());
        }
        if !text.contains("/nonexistent/libnccl-net-absent.so") {
            return Err(format!("the error does not name the plugin file: {text}").into());
        }
    }
    Ok(())
}

fn main() {
    multiproc::run_child(child);
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = Vec::new();
    for (hosts, per_host, full) in [(2, 2, true), (3, 2, false), (4, 2, false), (2, 1, true)] {
        trials.push(Trial::ignorable_test(
            format!("multinode::hostid::hosts_{hosts}x{per_host}"),
            move || by_host_id(BackendKind::Host, hosts, per_host, full, Vec::new()),
        ));
    }
    // GPUs: each rank on its own device where there are enough (else they share), the rail
    // over Ethernet through the proxy, the hosts' steps over the single-host kernels.
    for backend in [BackendKind::Cuda, BackendKind::Rocm] {
        for (hosts, per_host) in [(2, 1), (2, 2)] {
            trials.push(Trial::ignorable_test(
                format!("multinode::{backend}::hosts_{hosts}x{per_host}"),
                move || by_host_id(backend, hosts, per_host, true, Vec::new()),
            ));
        }
    }
    trials.push(Trial::test("multinode::hostid::peer_host_dies", || {
        peer_host_dies(Vec::new())
    }));
    trials.push(Trial::ignorable_test(
        "multinode::net::host::peer_host_dies",
        || {
            let plugin = match mscclpp_conformance::net_fixture::plugin() {
                Ok(p) => p,
                Err(why) => return Ok(Completion::ignored_with(why)),
            };
            peer_host_dies(vec![
                ("MSCCLPP_HIER_TRANSPORT".into(), "Net".into()),
                ("NCCL_NET_PLUGIN".into(), plugin.display().to_string()),
            ])
            .map(|()| Completion::Completed)
        },
    ));
    // The Net transport between hosts, through an NCCL net plugin: the fixture (or the plugin
    // MSCCLPP_TEST_NET_PLUGIN names), every collective on 2 hosts x 2 ranks, and on 2 hosts x 1
    // (every byte between the ranks crosses the plugin; on one GPU two processes time-slice it
    // far faster than four).
    for (backend, per_host) in [
        (BackendKind::Host, 2),
        (BackendKind::Cuda, 2),
        (BackendKind::Cuda, 1),
    ] {
        trials.push(Trial::ignorable_test(
            format!("multinode::net::{backend}::hosts_2x{per_host}"),
            move || {
                let plugin = match mscclpp_conformance::net_fixture::plugin() {
                    Ok(p) => p,
                    Err(why) => return Ok(Completion::ignored_with(why)),
                };
                by_host_id(
                    backend,
                    2,
                    per_host,
                    true,
                    vec![
                        ("MSCCLPP_HIER_TRANSPORT".into(), "Net".into()),
                        ("NCCL_NET_PLUGIN".into(), plugin.display().to_string()),
                    ],
                )
            },
        ));
    }
    // The oldest and the newest ABI the binding speaks, end to end (the fixture's v6 and v12
    // builds; the binding's own tests cover every version in between).
    for version in [6u32, 12] {
        trials.push(Trial::ignorable_test(
            format!("multinode::net::host::hosts_2x1_abi_v{version}"),
            move || {
                let plugin = match mscclpp_conformance::net_fixture::fixture(version) {
                    Ok(p) => p,
                    Err(why) => return Ok(Completion::ignored_with(why)),
                };
                by_host_id(
                    BackendKind::Host,
                    2,
                    1,
                    true,
                    vec![
                        ("MSCCLPP_HIER_TRANSPORT".into(), "Net".into()),
                        ("NCCL_NET_PLUGIN".into(), plugin.display().to_string()),
                        ("MSCCLPP_NET_PLUGIN_ABI".into(), version.to_string()),
                    ],
                )
            },
        ));
    }
    trials.push(Trial::test(
        "multinode::net::missing_plugin_is_named",
        missing_plugin_is_named,
    ));
    trials.push(Trial::ignorable_test(
        "multinode::netns::net::hosts_2x2",
        || {
            let plugin = match mscclpp_conformance::net_fixture::plugin() {
                Ok(p) => p,
                Err(why) => return Ok(Completion::ignored_with(why)),
            };
            by_namespace(
                2,
                2,
                vec![
                    ("MSCCLPP_HIER_TRANSPORT".into(), "Net".into()),
                    ("NCCL_NET_PLUGIN".into(), plugin.display().to_string()),
                ],
            )
        },
    ));
    trials.push(Trial::ignorable_test("multinode::netns::hosts_2x2", || {
        by_namespace(2, 2, Vec::new())
    }));
    libtest_mimic::run(&args, trials).exit();
}
