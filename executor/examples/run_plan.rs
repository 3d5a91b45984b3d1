//! Runs an execution plan on the host backend with thread ranks and checks it against a CPU
//! reference: `run_plan FILE [BYTES_PER_RANK]` (all-reduce sum, all-gather and all-to-all plans;
//! i32 data; in place when the plan says so); plans of other collectives (the DSL's unit
//! tests) are only run. Prints the result, or the error; exits 1 on either.

use std::sync::Arc;
use std::time::Duration;

use mscclpp_comm::Communicator;
use mscclpp_comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot};
use mscclpp_executor::{Executor, Plan};
use mscclpp_hal::{DataType, MemoryKind};

fn values(seed: u64, n: usize) -> Vec<i32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 2001) as i32 - 1000
        })
        .collect()
}

fn rank_main(
    plan: &Plan,
    rank: usize,
    n: usize,
    boot: Bootstrap,
    bytes: usize,
) -> Result<(), String> {
    let e = |x: mscclpp_hal::Error| format!("rank {rank}: {x}");
    let backend = mscclpp_host::probe().map_err(e)?;
    let device = backend.open_device(rank).map_err(e)?;
    let comm = Arc::new(Communicator::new(Arc::new(boot), device.clone()));
    let exec = Executor::new(comm).map_err(e)?;
    let stream = device.create_stream().map_err(e)?;
    let elems = bytes / 4;
    let inputs: Vec<Vec<i32>> = (0..n)
        .map(|r| values(r as u64 * 7919 + 11, elems))
        .collect();
    let (in_elems, out_elems, expected): (usize, usize, Vec<i32>) = match plan.collective.as_str() {
        "allreduce" => (
            elems,
            elems,
            (0..elems)
                .map(|i| inputs.iter().map(|v| v[i]).sum())
                .collect(),
        ),
        "allgather" => (elems, elems * n, inputs.concat()),
        "alltoall" => {
            let b = elems / n;
            let out = (0..n)
                .flat_map(|p| inputs[p][rank * b..(rank + 1) * b].to_vec())
                .collect();
            (elems, elems, out)
        }
        // No reference (the DSL's unit-test plans): the plan must run without error.
        _ => (elems, elems, Vec::new()),
    };
    let inbuf = device.alloc(in_elems * 4, MemoryKind::Device).map_err(e)?;
    let outbuf = device.alloc(out_elems * 4, MemoryKind::Device).map_err(e)?;
    stream.fill(&outbuf.full(), 0xA5).map_err(e)?;
    let (send, recv) = match (plan.inplace, plan.collective.as_str()) {
        (true, "allgather") => (
            outbuf
                .slice(rank * in_elems * 4..(rank + 1) * in_elems * 4)
                .map_err(e)?,
            outbuf.full(),
        ),
        (true, _) => (inbuf.full(), inbuf.full()),
        (false, _) => (inbuf.full(), outbuf.full()),
    };
    let mine: Vec<u8> = inputs[rank].iter().flat_map(|v| v.to_le_bytes()).collect();
    stream.write_from_host(&send, &mine).map_err(e)?;
    exec.communicator().bootstrap().barrier().map_err(e)?;
    for _ in 0..2 {
        exec.execute(plan, &send, &recv, DataType::I32, None, &*stream)
            .map_err(e)?;
        stream.synchronize().map_err(e)?;
        let mut got = vec![0u8; recv.len()];
        stream.read_to_host(&mut got, &recv).map_err(e)?;
        let wrong = got
            .chunks_exact(4)
            .zip(&expected)
            .filter(|(c, x)| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) != **x)
            .count();
        if wrong != 0 {
            return Err(format!(
                "rank {rank}: {wrong} of {} elements wrong",
                expected.len()
            ));
        }
        exec.communicator().bootstrap().barrier().map_err(e)?;
        if plan.inplace {
            // In place, the output overwrote the input: one execution is what can be checked.
            break;
        }
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: run_plan FILE [BYTES_PER_RANK]");
        std::process::exit(2);
    };
    let bytes: usize = args.get(2).and_then(|b| b.parse().ok()).unwrap_or(1 << 16);
    let n = std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("gpus").and_then(|g| g.as_array()).map(|g| g.len()))
        .unwrap_or(0);
    let plan = match Plan::from_file(std::path::Path::new(path), n) {
        Ok(p) => Arc::new(p),
        Err(err) => {
            println!("FAIL {path}: {err}");
            std::process::exit(1);
        }
    };
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(20),
        ..BootstrapConfig::default()
    };
    let started = BootstrapRoot::start("127.0.0.1:0".parse().expect("an address"), n, &cfg);
    let (_root, uid) = match started {
        Ok(x) => x,
        Err(err) => {
            println!("FAIL {path}: bootstrap: {err}");
            std::process::exit(1);
        }
    };
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (plan, uid, cfg) = (plan.clone(), uid, cfg.clone());
            std::thread::spawn(move || {
                let boot = Bootstrap::new(&uid, rank, n, cfg).map_err(|x| x.to_string())?;
                rank_main(&plan, rank, n, boot, bytes)
            })
        })
        .collect();
    let errors: Vec<String> = handles
        .into_iter()
        .filter_map(|h| match h.join() {
            Ok(Ok(())) => None,
            Ok(Err(m)) => Some(m),
            Err(_) => Some("a rank panicked".into()),
        })
        .collect();
    if errors.is_empty() {
        println!(
            "ok   {path}: {} {} ranks, {bytes} bytes per rank",
            plan.collective, n
        );
    } else {
        println!("FAIL {path}: {}", errors[0]);
        std::process::exit(1);
    }
}
