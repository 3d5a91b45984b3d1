//! Two processes signal each other back and forth through a `BaseMemoryChannel` (MSCCL++'s
//! ping-pong tutorial): one GPU thread per side, `rounds` round trips timed with events.
//!
//! `cargo run --release -p mscclpp-perf --example gpu_ping_pong`

mod common;

use std::sync::Arc;

use mscclpp::comm::channel::BaseMemoryChannel;
use mscclpp::comm::semaphore::MemoryDevice2DeviceSemaphore;
use mscclpp::hal::{DynKernel, LaunchConfig};
use mscclpp::transports::{EndpointConfig, Transport};
use mscclpp_perf::bench_kernels::{MODULE, PING_PONG, PingPongArgs};

fn main() -> mscclpp::Result<()> {
    let Some(comm) = common::two_ranks()? else {
        return Ok(());
    };
    let peer = 1 - comm.rank();
    let conn = comm.connect(peer, EndpointConfig::new(Transport::CudaIpc))?;
    let sem = Arc::new(MemoryDevice2DeviceSemaphore::new(&comm, &conn)?);
    let channel = BaseMemoryChannel::new(sem);
    let device = comm.device();
    let stream = device.create_stream()?;
    let kernel = DynKernel::<PingPongArgs>::load(&**device, &MODULE, PING_PONG)?;
    let (start, end) = (device.create_event()?, device.create_event()?);
    for (relaxed, rounds) in [(1u32, 1000u64), (1, 10_000), (0, 10_000)] {
        let args = PingPongArgs {
            chan: channel.device_handle(),
            rounds,
            initiator: u32::from(comm.rank() == 0),
            relaxed,
        };
        comm.bootstrap().barrier()?;
        stream.record(&*start)?;
        // SAFETY: the channel (and its semaphore tokens) outlives the kernel: we synchronise below.
        unsafe { kernel.launch(&*stream, LaunchConfig::linear(1, 1), &args)? };
        stream.record(&*end)?;
        stream.synchronize()?;
        let us = end.elapsed_ms_since(&*start)? * 1e3 / rounds as f64;
        if comm.rank() == 0 {
            let kind = if relaxed != 0 {
                "relaxed"
            } else {
                "acquire/release"
            };
            println!("ping-pong ({kind}, {rounds} rounds): {us:.2} us per round trip");
        }
    }
    comm.bootstrap().barrier()?;
    Ok(())
}
