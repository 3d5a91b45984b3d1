//! Plans written by `mscclpp_executor::testgen` run on the host backend with thread ranks,
//! against a CPU reference: random data, outputs poisoned first, each plan executed several
//! times on the same buffers (the flag advances, contexts are reused) with fresh data each time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mscclpp_comm::Communicator;
use mscclpp_comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot};
use mscclpp_executor::{Executor, Plan, testgen};
use mscclpp_hal::{DataType, MemoryKind};

const POISON: u8 = 0xA5;
const REPEATS: usize = 3;

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// A small deterministic generator (xorshift), one stream per rank and round.
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

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    AllReduce,
    AllGather,
}

/// Runs `plan` on `n` thread ranks with `elems` i32 elements per rank input.
fn run(plan_json: serde_json::Value, n: usize, kind: Kind, inplace: bool, elems: usize) -> R<()> {
    let bytes = serde_json::to_vec(&plan_json).map_err(e)?;
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(30),
        ..BootstrapConfig::default()
    };
    let (_root, uid) =
        BootstrapRoot::start("127.0.0.1:0".parse::<SocketAddr>().map_err(e)?, n, &cfg)
            .map_err(e)?;
    let backend = mscclpp_host::probe().map_err(e)?;
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (uid, cfg, bytes, backend) = (uid, cfg.clone(), bytes.clone(), backend.clone());
            std::thread::spawn(move || -> R<()> {
                let plan = Plan::from_bytes(&bytes, n).map_err(e)?;
                let boot = Arc::new(Bootstrap::new(&uid, rank, n, cfg).map_err(e)?);
                let device = backend.open_device(rank).map_err(e)?;
                let comm = Arc::new(Communicator::new(boot, device.clone()));
                let exec = Executor::new(comm).map_err(e)?;
                let stream = device.create_stream().map_err(e)?;
                let out_elems = if kind == Kind::AllGather { elems * n } else { elems };
                let inbuf = device.alloc(elems * 4, MemoryKind::Device).map_err(e)?;
                let outbuf = device.alloc(out_elems * 4, MemoryKind::Device).map_err(e)?;
                for round in 0..REPEATS {
                    let inputs: Vec<Vec<i32>> = (0..n)
                        .map(|r| values(((round * 64 + r) as u64) * 0x9e37_79b9 + 7, elems))
                        .collect();
                    let (send, recv) = match (kind, inplace) {
                        (Kind::AllReduce, true) => (inbuf.full(), inbuf.full()),
                        (Kind::AllGather, true) => (
                            outbuf.slice(rank * elems * 4..(rank + 1) * elems * 4).map_err(e)?,
                            outbuf.full(),
                        ),
                        _ => (inbuf.full(), outbuf.full()),
                    };
                    stream.fill(&outbuf.full(), POISON).map_err(e)?;
                    let mine: Vec<u8> = inputs[rank].iter().flat_map(|v| v.to_le_bytes()).collect();
                    stream.write_from_host(&send, &mine).map_err(e)?;
                    // Every rank's input is in place before anyone reads it: the plans
                    // synchronise inside, but poisoning the output must not race a peer's put.
                    exec.communicator().bootstrap().barrier().map_err(e)?;
                    exec.execute(&plan, &send, &recv, DataType::I32, None, &*stream)
                        .map_err(e)?;
                    stream.synchronize().map_err(|x| format!("rank {rank} round {round}: {x}"))?;
                    let expected: Vec<i32> = match kind {
                        Kind::AllReduce => (0..elems)
                            .map(|i| inputs.iter().map(|v| v[i]).fold(0i32, i32::wrapping_add))
                            .collect(),
                        Kind::AllGather => inputs.concat(),
                    };
                    let mut got = vec![0u8; recv.len()];
                    stream.read_to_host(&mut got, &recv).map_err(e)?;
                    let got: Vec<i32> = got
                        .chunks_exact(4)
                        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    if let Some(i) = (0..expected.len()).find(|&i| got[i] != expected[i]) {
                        return Err(format!(
                            "rank {rank} round {round}: element {i} is {}, expected {} ({} wrong of {})",
                            got[i],
                            expected[i],
                            (0..expected.len()).filter(|&i| got[i] != expected[i]).count(),
                            expected.len()
                        ));
                    }
                    // Nobody starts the next round (poisoning outputs) while a peer still reads.
                    exec.communicator().bootstrap().barrier().map_err(e)?;
                }
                Ok(())
            })
        })
        .collect();
    let mut errors = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(m)) => errors.push(m),
            Err(_) => errors.push("a rank panicked".into()),
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

macro_rules! cases {
    ($($name:ident: $gen:path, $kind:expr, $n:expr, $inplace:expr, $elems:expr;)*) => {$(
        #[test]
        fn $name() {
            run($gen($n, $inplace), $n, $kind, $inplace, $elems).unwrap();
        }
    )*};
}

// Element counts: whole 16-byte units per chunk (the plans' buffer_alignment), several KiB.
cases! {
    allreduce_simple_2: testgen::allreduce_simple, Kind::AllReduce, 2, false, 2048;
    allreduce_simple_3_in_place: testgen::allreduce_simple, Kind::AllReduce, 3, true, 3 * 500;
    allreduce_simple_4: testgen::allreduce_simple, Kind::AllReduce, 4, false, 4 * 300;
    allreduce_ll_2: testgen::allreduce_ll, Kind::AllReduce, 2, false, 2048;
    allreduce_ll_3: testgen::allreduce_ll, Kind::AllReduce, 3, false, 3 * 500;
    allreduce_ll_4_in_place: testgen::allreduce_ll, Kind::AllReduce, 4, true, 4 * 300;
    allgather_simple_2: testgen::allgather_simple, Kind::AllGather, 2, false, 1000;
    allgather_simple_3_in_place: testgen::allgather_simple, Kind::AllGather, 3, true, 700;
    allgather_simple_4: testgen::allgather_simple, Kind::AllGather, 4, false, 500;
    allreduce_nvls_2: testgen::allreduce_nvls, Kind::AllReduce, 2, false, 2048;
    allreduce_nvls_3_in_place: testgen::allreduce_nvls, Kind::AllReduce, 3, true, 3 * 500;
    allreduce_nvls_4: testgen::allreduce_nvls, Kind::AllReduce, 4, false, 4 * 300;
    allgather_nvls_2_in_place: testgen::allgather_nvls, Kind::AllGather, 2, true, 1000;
    allgather_nvls_3: testgen::allgather_nvls, Kind::AllGather, 3, false, 700;
    allgather_nvls_4: testgen::allgather_nvls, Kind::AllGather, 4, false, 500;
    allgather_nvls_ll_2: testgen::allgather_nvls_ll, Kind::AllGather, 2, false, 1000;
    allgather_nvls_ll_3_in_place: testgen::allgather_nvls_ll, Kind::AllGather, 3, true, 700;
    allgather_nvls_ll_4: testgen::allgather_nvls_ll, Kind::AllGather, 4, false, 500;
}
