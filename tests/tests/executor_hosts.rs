//! The executor across hosts on this machine: ranks as processes on the host backend, grouped
//! into "hosts" by `MSCCLPP_HOSTID`. A plan of the multi-node shape (memory channels within a
//! host, port channels between hosts: `testgen::allgather_hosts`) runs over the transport
//! between hosts (Ethernet, and Net through the NCCL net plugin fixture; also between network
//! namespaces where root and `ip` are there), outputs poisoned
//! first, random inputs (1024 i32 per rank: whole 16-byte units, as plans need), in and out of
//! place, several rounds, checked against a CPU reference; a plan whose memory channels cross
//! the hosts is refused on every rank naming the channel, the ranks and their hosts; a
//! transport between hosts that cannot open is named with the channel and ranks it was for.
//! Runs with `cargo test -p mscclpp-conformance --test executor_hosts`.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Completion, Failed, Trial};
use mscclpp::comm::Communicator;
use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot, UniqueId};
use mscclpp::hal::{DataType, MemoryKind};
use mscclpp_conformance::multiproc;
use mscclpp_conformance::netns::{NET, Namespaces};
use mscclpp_conformance::rng::Rng;
use mscclpp_executor::{Executor, Plan, testgen};

const UID_VAR: &str = "MSCCLPP_TEST_UID";
const SHAPE_VAR: &str = "MSCCLPP_TEST_HOSTS";
const SEED_VAR: &str = "MSCCLPP_TEST_SEED";
const ROUNDS: usize = 3;
const POISON: u8 = 0xA5;

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// Rank `r`'s input of `round`: `elems` i32 from the seed.
fn input(seed: u64, round: usize, r: usize, elems: usize) -> Vec<i32> {
    let mut rng = Rng::new(seed ^ ((round as u64) << 32) ^ (r as u64 * 0x9e37_79b9));
    (0..elems).map(|_| rng.next_u64() as i32).collect()
}

fn child(role: &str) -> R<()> {
    let (rank, n) = multiproc::rank_and_size();
    let get = |v: &str| std::env::var(v).map_err(|_| format!("{v} is not set"));
    let uid: UniqueId = get(UID_VAR)?.parse().map_err(|x| format!("uid: {x}"))?;
    let seed: u64 = get(SEED_VAR)?.parse().map_err(e)?;
    let (hosts, per_host) = get(SHAPE_VAR)?
        .split_once('x')
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
        .ok_or("bad host shape")?;
    let boot = Bootstrap::new(&uid, rank, n, BootstrapConfig::from_env().map_err(e)?).map_err(e)?;
    let backend = mscclpp::registry::probe(mscclpp::hal::BackendKind::Host).map_err(e)?;
    let device = backend.open_device(0).map_err(e)?;
    let comm = Arc::new(Communicator::new(Arc::new(boot), device.clone()));
    let exec = Executor::new(comm.clone()).map_err(e)?;
    let stream = device.create_stream().map_err(e)?;
    if role == "no-transport" {
        // The transport between hosts named (MSCCLPP_HIER_TRANSPORT) cannot open here.
        let json =
            serde_json::to_vec(&testgen::allgather_hosts(hosts, per_host, false)).map_err(e)?;
        let plan = Plan::from_bytes(&json, n).map_err(e)?;
        let buf = device.alloc(64 * n, MemoryKind::Device).map_err(e)?;
        let got = exec.execute(
            &plan,
            &buf.slice(0..64).map_err(e)?,
            &buf.full(),
            DataType::I32,
            None,
            &*stream,
        );
        let msg = match got {
            Ok(()) => return Err("ran over a transport that cannot open".into()),
            Err(x) => x.to_string(),
        };
        if !(msg.contains("port channel from rank") && msg.contains("over Net5")) {
            return Err(format!(
                "refused, but not naming the channel and transport: {msg}"
            ));
        }
        multiproc::report("refused", "ok");
        return Ok(());
    }
    if role == "refused" {
        // Memory channels between every pair: those to the other host cannot exist.
        let json = serde_json::to_vec(&testgen::allgather_simple(n, false)).map_err(e)?;
        let plan = Plan::from_bytes(&json, n).map_err(e)?;
        let buf = device.alloc(4 * n, MemoryKind::Device).map_err(e)?;
        let got = exec.execute(
            &plan,
            &buf.slice(0..4).map_err(e)?,
            &buf.full(),
            DataType::I32,
            None,
            &*stream,
        );
        let msg = match got {
            Ok(()) => return Err("a plan with memory channels across hosts ran".into()),
            Err(x) => x.to_string(),
        };
        if !(msg.contains("memory channel to rank") && msg.contains("hosts")) {
            return Err(format!(
                "refused, but not naming the channel and hosts: {msg}"
            ));
        }
        multiproc::report("refused", "ok");
        return Ok(());
    }
    let elems = 1024;
    for inplace in [false, true] {
        let json =
            serde_json::to_vec(&testgen::allgather_hosts(hosts, per_host, inplace)).map_err(e)?;
        let plan = Plan::from_bytes(&json, n).map_err(e)?;
        let inbuf = device.alloc(elems * 4, MemoryKind::Device).map_err(e)?;
        let outbuf = device.alloc(elems * 4 * n, MemoryKind::Device).map_err(e)?;
        let (send, recv) = if inplace {
            (
                outbuf
                    .slice(rank * elems * 4..(rank + 1) * elems * 4)
                    .map_err(e)?,
                outbuf.full(),
            )
        } else {
            (inbuf.full(), outbuf.full())
        };
        for round in 0..ROUNDS {
            stream.fill(&outbuf.full(), POISON).map_err(e)?;
            let mine: Vec<u8> = input(seed, round, rank, elems)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            stream.write_from_host(&send, &mine).map_err(e)?;
            stream.synchronize().map_err(e)?;
            comm.bootstrap().barrier().map_err(e)?;
            exec.execute(&plan, &send, &recv, DataType::I32, None, &*stream)
                .map_err(|x| format!("execute ({}): {x}", plan.name))?;
            stream
                .synchronize()
                .map_err(|x| format!("round {round}: {x}"))?;
            let mut got = vec![0u8; recv.len()];
            stream.read_to_host(&mut got, &recv).map_err(e)?;
            let want: Vec<u8> = (0..n)
                .flat_map(|r| input(seed, round, r, elems))
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let wrong = got
                .chunks(4)
                .zip(want.chunks(4))
                .filter(|(a, b)| a != b)
                .count();
            if wrong != 0 {
                return Err(format!(
                    "{} round {round}: {wrong} of {} elements wrong",
                    plan.name,
                    n * elems
                ));
            }
            comm.bootstrap().barrier().map_err(e)?;
        }
    }
    multiproc::report("executed", "ok");
    Ok(())
}

/// `hosts` x `per_host` ranks in `role`, each with `MSCCLPP_HOSTID` naming its host.
fn run(role: &'static str, hosts: usize, per_host: usize) -> Result<(), Failed> {
    run_with(role, hosts, per_host, Vec::new())
}

fn run_with(
    role: &'static str,
    hosts: usize,
    per_host: usize,
    extra: Vec<(String, String)>,
) -> Result<(), Failed> {
    let n = hosts * per_host;
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(60),
        ..BootstrapConfig::default()
    };
    let (_root, uid) =
        BootstrapRoot::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), n, &cfg).map_err(e)?;
    let (_, seed) = Rng::from_time();
    let kids: Vec<_> = (0..n)
        .map(|r| {
            let env = vec![
                (UID_VAR.to_string(), uid.to_string()),
                (SEED_VAR.to_string(), seed.to_string()),
                (SHAPE_VAR.to_string(), format!("{hosts}x{per_host}")),
                ("MSCCLPP_BOOTSTRAP_TIMEOUT".into(), "60".into()),
                ("MSCCLPP_BACKEND".into(), "host".into()),
                (
                    "MSCCLPP_HOSTID".into(),
                    format!("exec-hosts-{}-{}", std::process::id(), r / per_host),
                ),
            ];
            let env: Vec<_> = env.into_iter().chain(extra.iter().cloned()).collect();
            multiproc::spawn(role, r, n, &env)
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| multiproc::wait(k, deadline))
        .collect();
    let key = if role == "executed" {
        "executed"
    } else {
        "refused"
    };
    let bad: Vec<String> = outs
        .iter()
        .filter(|o| !o.ok() || o.reports().get(key).map(String::as_str) != Some("ok"))
        .map(multiproc::ChildOutcome::describe)
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{role}, {hosts} hosts x {per_host}, seed {seed}:\n{}",
            bad.join("\n")
        )
        .into())
    }
}

/// `hosts` network namespaces of `per_host` ranks each (the host ids name the namespaces; the
/// root and every rank on the namespaces' addresses): the multi-node plan over Ethernet between
/// real network stacks. Ignored, saying why, where namespaces cannot be made.
fn by_namespace(hosts: usize, per_host: usize) -> Result<Completion, Failed> {
    let ns = match Namespaces::create(hosts) {
        Ok(ns) => ns,
        Err(why) => {
            return Ok(Completion::ignored_with(format!(
                "cannot make network namespaces here (needs root and `ip`): {why}"
            )));
        }
    };
    let n = hosts * per_host;
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(60),
        ..BootstrapConfig::default()
    };
    let root_ip: Ipv4Addr = format!("{NET}.254").parse().map_err(|_| "root address")?;
    let (_root, uid) = BootstrapRoot::start(SocketAddr::from((root_ip, 0)), n, &cfg).map_err(e)?;
    let (_, seed) = Rng::from_time();
    let kids: Vec<_> = (0..n)
        .map(|r| {
            let h = r / per_host;
            let vars = vec![
                (UID_VAR.to_string(), uid.to_string()),
                (SEED_VAR.to_string(), seed.to_string()),
                (SHAPE_VAR.to_string(), format!("{hosts}x{per_host}")),
                ("MSCCLPP_BOOTSTRAP_TIMEOUT".into(), "60".into()),
                ("MSCCLPP_BACKEND".into(), "host".into()),
                ("MSCCLPP_SOCKET_IFNAME".into(), format!("{NET}.{}", h + 1)),
                (
                    "MSCCLPP_HOSTID".into(),
                    format!("exec-netns-{}-{h}", std::process::id()),
                ),
            ];
            multiproc::spawn_via(
                &["ip", "netns", "exec", &ns.names[h]],
                "executed",
                r,
                n,
                &vars,
            )
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let bad: Vec<String> = kids
        .into_iter()
        .map(|k| multiproc::wait(k, deadline))
        .filter(|o| !o.ok() || o.reports().get("executed").map(String::as_str) != Some("ok"))
        .map(|o| o.describe())
        .collect();
    if bad.is_empty() {
        Ok(Completion::Completed)
    } else {
        Err(format!(
            "{hosts} namespaces x {per_host}, seed {seed}:\n{}",
            bad.join("\n")
        )
        .into())
    }
}

fn main() {
    multiproc::run_child(child);
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = Vec::new();
    for (hosts, per_host) in [(2, 2), (2, 1), (3, 2)] {
        trials.push(Trial::test(
            format!("executor_hosts::allgather_{hosts}x{per_host}"),
            move || run("executed", hosts, per_host),
        ));
    }
    // The Net transport between the hosts, through an NCCL net plugin (the fixture, or the one
    // MSCCLPP_TEST_NET_PLUGIN names); ignored with the reason where none builds.
    for (hosts, per_host) in [(2, 2), (2, 1)] {
        trials.push(Trial::ignorable_test(
            format!("executor_hosts::net::allgather_{hosts}x{per_host}"),
            move || {
                let plugin = match mscclpp_conformance::net_fixture::plugin() {
                    Ok(p) => p,
                    Err(why) => return Ok(Completion::ignored_with(why)),
                };
                run_with(
                    "executed",
                    hosts,
                    per_host,
                    vec![
                        ("MSCCLPP_HIER_TRANSPORT".into(), "Net".into()),
                        ("NCCL_NET_PLUGIN".into(), plugin.display().to_string()),
                    ],
                )
                .map(|()| Completion::Completed)
            },
        ));
    }
    trials.push(Trial::ignorable_test(
        "executor_hosts::netns::allgather_2x2",
        || by_namespace(2, 2),
    ));
    trials.push(Trial::test(
        "executor_hosts::memory_channels_across_hosts_refused",
        || run("refused", 2, 1),
    ));
    trials.push(Trial::test(
        "executor_hosts::transport_that_cannot_open_named",
        || {
            run_with(
                "no-transport",
                2,
                1,
                vec![
                    ("MSCCLPP_HIER_TRANSPORT".into(), "Net5".into()),
                    (
                        "NCCL_NET_PLUGIN".into(),
                        "/nonexistent/libnccl-net.so".into(),
                    ),
                ],
            )
        },
    ));
    libtest_mimic::run(&args, trials).exit();
}
