//! The p2p benchmark: every rank copies into the next rank's buffer through an IPC mapping
//! (the CudaIpc path of the HAL: copy engine on GPUs, memcpy on the host backend), with the
//! receiving rank checking every byte; plus bootstrap latencies.

use std::sync::Arc;
use std::time::Instant;

use mscclpp::comm::bootstrap::Bootstrap;
use mscclpp::hal::{Device, Error, IpcHandle, MemoryKind, Result};

use crate::args::Args;
use crate::report::{Meta, Row, Table};

/// Rank- and size-dependent test bytes.
pub fn pattern(rank: usize, size: usize, len: usize) -> Vec<u8> {
    // A cheap, rank- and size-dependent sequence: a wrong source or a stale size shows up.
    let mut x = (rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ size as u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Runs the benchmark on this rank; rank 0 prints. Returns the wrong bytes over all ranks.
pub fn run(args: &Args, boot: &Bootstrap, device: Arc<dyn Device>) -> Result<u64> {
    let (rank, n) = (boot.rank(), boot.nranks());
    let sizes = args.sizes();
    let max = *sizes
        .last()
        .ok_or_else(|| Error::invalid("no sizes to measure"))?;
    let stream = device.create_stream()?;
    let (ev0, ev1) = (device.create_event()?, device.create_event()?);
    let src = device.alloc(max, MemoryKind::Device)?;
    let dst = device.alloc(max, MemoryKind::Device)?;

    // Exchange handles: each rank maps the next rank's destination buffer.
    let handles = boot.all_gather(&device.ipc_export(&dst)?.to_bytes())?;
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    let peer_dst = device.ipc_import(&IpcHandle::from_bytes(&handles[next])?)?;

    let mut table = Table::new(args.json_out(), rank == 0, false);
    table.preamble(
        &format!(
            "mscclpp-perf p2p: {n} ranks on the {} backend ({}), each rank copies into rank+1's buffer through an IPC mapping",
            device.info().backend,
            device.info().name
        ),
        &Meta {
            bench: "p2p",
            backend: device.info().backend.to_string(),
            device: device.info().name.clone(),
            nranks: n,
            timing: "eager copies".into(),
        },
    )?;
    table.legend(&[format!(
        "time(us): microseconds per copy, the mean over {} copies after {} warm-up, the slowest rank's; algbw = busbw = size / time (GB/s = 1e9 B/s)",
        args.iters, args.warmup
    )]);
    bootstrap_latency(boot, &mut table)?;
    table.header();

    for &size in &sizes {
        let mine = pattern(rank, size, size);
        stream.write_from_host(&src.slice(..size)?, &mine)?;
        stream.fill(&dst.slice(..size)?, 0xA5)?; // poison
        stream.synchronize()?;
        boot.barrier()?;
        for _ in 0..args.warmup {
            stream.copy(&peer_dst.slice(..size)?, &src.slice(..size)?)?;
        }
        stream.synchronize()?;
        boot.barrier()?;
        stream.record(&*ev0)?;
        for _ in 0..args.iters {
            stream.copy(&peer_dst.slice(..size)?, &src.slice(..size)?)?;
        }
        stream.record(&*ev1)?;
        stream.synchronize()?;
        let ms = ev1.elapsed_ms_since(&*ev0)?;
        boot.barrier()?; // every writer done before anyone checks
        let wrong = if args.check != 0 {
            let mut got = vec![0u8; size];
            stream.read_to_host(&mut got, &dst.slice(..size)?)?;
            let expect = pattern(prev, size, size);
            got.iter().zip(&expect).filter(|(a, b)| a != b).count() as u64
        } else {
            0
        };
        // Gather every rank's time and error count; report the slowest rank and the sum.
        let mut msg = Vec::with_capacity(16);
        msg.extend_from_slice(&ms.to_le_bytes());
        msg.extend_from_slice(&wrong.to_le_bytes());
        let all = boot.all_gather(&msg)?;
        let mut worst_ms = 0f64;
        let mut total_wrong = 0u64;
        for m in &all {
            let bytes: [u8; 16] = m.as_slice().try_into().map_err(|_| {
                Error::malformed("perf result", format!("{} bytes instead of 16", m.len()))
            })?;
            let (t, w) = bytes.split_at(8);
            worst_ms = worst_ms.max(f64::from_le_bytes(t.try_into().unwrap_or([0; 8])));
            total_wrong += u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        }
        let us = worst_ms * 1e3 / args.iters as f64;
        table.row(&Row {
            bench: "p2p",
            bytes: size,
            count: size,
            dtype: "u8",
            op: "copy",
            root: None,
            nranks: n,
            time_us: us,
            cpu_us: None,
            algbw_gbps: size as f64 / us / 1e3,
            busbw_gbps: size as f64 / us / 1e3,
            wrong: if args.check != 0 {
                Some(total_wrong)
            } else {
                None
            },
            baseline: None,
            algo: None,
        });
    }
    table.footer();
    Ok(table.wrong_total())
}

fn bootstrap_latency(boot: &Bootstrap, table: &mut Table) -> Result<()> {
    const REPS: u32 = 200;
    boot.barrier()?;
    let t = Instant::now();
    for _ in 0..REPS {
        boot.barrier()?;
    }
    let barrier_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(REPS);
    let payload = vec![7u8; 4096];
    let t = Instant::now();
    for _ in 0..REPS {
        boot.all_gather(&payload)?;
    }
    let gather_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(REPS);
    table.comment(&format!(
        "bootstrap (TCP, {} ranks): barrier {barrier_us:.1} us, all_gather of 4 KiB {gather_us:.1} us",
        boot.nranks()
    ));
    Ok(())
}
