//! Both ranks put into each other's buffer at once through `MemoryChannel`s (the device copies
//! over the peer link), then signal; GB/s per direction and in sum by size, every byte checked.
//!
//! `cargo run --release -p mscclpp-perf --example bidir_memory_channel`
//!
//! Sizes from 1 KiB to 1 GiB on a GPU, 16 MiB on the host backend (its buffers are RAM);
//! `MSCCLPP_EXAMPLE_MAX_BYTES` sets the largest.

mod common;

use std::sync::Arc;

use mscclpp::comm::channel::MemoryChannel;
use mscclpp::comm::semaphore::MemoryDevice2DeviceSemaphore;
use mscclpp::hal::{DynKernel, LaunchConfig, MemoryKind};
use mscclpp::transports::{EndpointConfig, Transport, TransportFlags};
use mscclpp_perf::bench_kernels::{MEMORY_CHANNEL_PUT, MODULE, MemoryChannelPutArgs};

/// The largest size on a GPU.
const GPU_MAX: usize = 1 << 30;

fn main() -> mscclpp::Result<()> {
    let Some(comm) = common::two_ranks()? else {
        return Ok(());
    };
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let device = comm.device().clone();
    let max = common::max_bytes(&comm, GPU_MAX)?;
    let (src, dst) = (
        device.alloc(max, MemoryKind::Device)?,
        device.alloc(max, MemoryKind::Device)?,
    );
    let stream = device.create_stream()?;
    let conn = comm.connect(peer, EndpointConfig::new(Transport::CudaIpc))?;
    let sem = Arc::new(MemoryDevice2DeviceSemaphore::new(&comm, &conn)?);
    let mine = comm.register_memory(&dst.full(), TransportFlags::single(Transport::CudaIpc))?;
    let theirs = Arc::new(comm.exchange_memory(&mine, peer)?);
    let channel = MemoryChannel::new(sem, theirs, src.full(), None)?;
    let kernel = DynKernel::<MemoryChannelPutArgs>::load(&*device, &MODULE, MEMORY_CHANNEL_PUT)?;
    let blocks = device.info().multiprocessors.clamp(1, 132);
    let threads = if device.info().warp_size == 1 {
        1
    } else {
        1024
    };
    let (e0, e1) = (device.create_event()?, device.create_event()?);
    if rank == 0 {
        println!(
            "{:>12} {:>10} {:>12} {:>12}",
            "bytes", "us/iter", "GB/s 1-way", "GB/s sum"
        );
    }
    let mut size = 1 << 10;
    while size <= max {
        stream.fill(&src.slice(..size)?, rank as u8 + 1)?;
        stream.fill(&dst.slice(..size)?, 0)?;
        stream.synchronize()?;
        comm.bootstrap().barrier()?;
        let iters = if size >= 64 << 20 { 10 } else { 50 };
        let launch = |iters: u64| {
            let a = MemoryChannelPutArgs {
                chan: channel.device_handle(),
                bytes: size as u64,
                iters,
            };
            // SAFETY: buffers and channel outlive the launch (synchronised below); `size` fits both.
            unsafe { kernel.launch(&*stream, LaunchConfig::linear(blocks, threads), &a) }
        };
        launch(2)?;
        stream.record(&*e0)?;
        launch(iters)?;
        stream.record(&*e1)?;
        stream.synchronize()?;
        let us = e1.elapsed_ms_since(&*e0)? * 1e3 / iters as f64;
        comm.bootstrap().barrier()?;
        let mut got = vec![0u8; size];
        stream.read_to_host(&mut got, &dst.slice(..size)?)?;
        let wrong = got.iter().filter(|&&b| b != peer as u8 + 1).count();
        if wrong != 0 {
            return Err(mscclpp::Error::Internal(format!(
                "{wrong} wrong bytes at size {size}"
            )));
        }
        if rank == 0 {
            let gbs = size as f64 / us / 1e3;
            println!(
                "{size:>12} {us:>10.2} {} {}",
                common::gbps(gbs, 12),
                common::gbps(gbs * 2.0, 12)
            );
        }
        size *= 4;
    }
    Ok(())
}
