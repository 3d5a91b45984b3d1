//! Both ranks `putWithSignal` into each other through `PortChannel`s: the device posts requests
//! into the proxy's FIFO and the host proxy moves the data (copy engine on GPUs); GB/s by size.
//! `--transport Ethernet` sends over TCP instead.
//!
//! `cargo run --release -p mscclpp-perf --example bidir_port_channel [-- Ethernet]`
//!
//! Sizes from 1 KiB to 1 GiB on a GPU (64 MiB over Ethernet), at most 16 MiB on the host
//! backend (its buffers are RAM); `MSCCLPP_EXAMPLE_MAX_BYTES` sets the largest.

mod common;

use std::sync::Arc;

use mscclpp::comm::proxy::ProxyService;
use mscclpp::comm::semaphore::Host2DeviceSemaphore;
use mscclpp::hal::{DynKernel, LaunchConfig, MemoryKind};
use mscclpp::transports::{EndpointConfig, Transport, TransportFlags};
use mscclpp_perf::bench_kernels::{MODULE, PORT_CHANNEL_PUT, PortChannelPutArgs};

fn main() -> mscclpp::Result<()> {
    let transport: Transport = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "CudaIpc".into())
        .parse()?;
    let gpu_max: usize = if transport == Transport::Ethernet {
        64 << 20
    } else {
        1 << 30
    };
    let Some(comm) = common::two_ranks()? else {
        return Ok(());
    };
    let max = common::max_bytes(&comm, gpu_max)?;
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let device = comm.device().clone();
    let (src, dst) = (
        device.alloc(max, MemoryKind::Device)?,
        device.alloc(max, MemoryKind::Device)?,
    );
    let stream = device.create_stream()?;
    let flags = TransportFlags::single(transport);
    let conn = comm.connect(peer, EndpointConfig::new(transport))?;
    let sem = Arc::new(Host2DeviceSemaphore::new(&comm, conn)?);
    let mine = comm.register_memory(&dst.full(), flags)?;
    let theirs = Arc::new(comm.exchange_memory(&mine, peer)?);
    let local = Arc::new(comm.register_memory(&src.full(), flags)?);
    let mut service = ProxyService::new(&device, 512)?;
    let s = service.add_semaphore(sem)?;
    let d = service.add_memory(theirs)?;
    let l = service.add_memory(local)?;
    let chan = service.port_channel(s, d, l)?;
    service.start()?;
    let kernel = DynKernel::<PortChannelPutArgs>::load(&*device, &MODULE, PORT_CHANNEL_PUT)?;
    let (e0, e1) = (device.create_event()?, device.create_event()?);
    if rank == 0 {
        println!(
            "# port channel over {}, moved by the host proxy",
            transport.carrier(device.info().backend)
        );
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
            let a = PortChannelPutArgs {
                chan,
                bytes: size as u64,
                iters,
            };
            // SAFETY: the service (FIFO, semaphore, memories) outlives the launch.
            unsafe { kernel.launch(&*stream, LaunchConfig::linear(1, 1), &a) }
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
        if got.iter().any(|&b| b != peer as u8 + 1) {
            return Err(mscclpp::Error::Internal(format!(
                "wrong bytes at size {size}"
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
    service.stop()
}
