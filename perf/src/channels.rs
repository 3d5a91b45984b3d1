//! Channel bandwidth benchmarks between two ranks, both directions at once (the MSCCL++
//! tutorials' `bidir_memory_channel` and `bidir_port_channel`): every round, each rank puts
//! `size` bytes into the other's buffer, signals, and waits for the other's signal.
//! `algbw` is one direction; `busbw` is both directions together.

use std::sync::Arc;

use mscclpp::comm::Communicator;
use mscclpp::comm::channel::MemoryChannel;
use mscclpp::comm::proxy::ProxyService;
use mscclpp::comm::semaphore::{Host2DeviceSemaphore, MemoryDevice2DeviceSemaphore};
use mscclpp::hal::{
    BackendKind, Device, DeviceBuffer, DynKernel, Error, LaunchConfig, MemoryKind, Result, Stream,
};
use mscclpp::transports::{EndpointConfig, Transport, TransportFlags};
use mscclpp_perf::bench_kernels::{
    MEMORY_CHANNEL_PUT, MODULE, MemoryChannelPutArgs, PORT_CHANNEL_PUT, PortChannelPutArgs,
};

use crate::args::Args;
use crate::collective::{HOST_LEGEND, host_bytes};
use crate::p2p::pattern;
use crate::report::{Meta, Row, Table};

/// The two buffers of one rank: what it sends from and what the peer writes into.
struct Buffers {
    src: DeviceBuffer,
    dst: DeviceBuffer,
}

fn buffers(device: &Arc<dyn Device>, max: usize) -> Result<Buffers> {
    Ok(Buffers {
        src: device.alloc(max, MemoryKind::Device)?,
        dst: device.alloc(max, MemoryKind::Device)?,
    })
}

/// Runs `launch(iters)` per size with warm-up, timing and a byte-for-byte check of what the
/// peer sent; prints rows on rank 0. Returns the wrong bytes over both ranks.
fn measure(
    args: &Args,
    comm: &Communicator,
    stream: &Arc<dyn Stream>,
    bufs: &Buffers,
    name: &'static str,
    table: &mut Table,
    launch: &dyn Fn(usize, u64) -> Result<()>,
) -> Result<u64> {
    let device = comm.device();
    let (ev0, ev1) = (device.create_event()?, device.create_event()?);
    let boot = comm.bootstrap();
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    for size in args.sizes() {
        stream.write_from_host(&bufs.src.slice(..size)?, &pattern(rank, size, size))?;
        stream.fill(&bufs.dst.slice(..size)?, 0xA5)?;
        stream.synchronize()?;
        boot.barrier()?;
        if args.warmup > 0 {
            launch(size, args.warmup as u64)?;
        }
        stream.synchronize()?;
        boot.barrier()?;
        stream.record(&*ev0)?;
        launch(size, args.iters as u64)?;
        stream.record(&*ev1)?;
        stream.synchronize()?;
        let us = ev1.elapsed_ms_since(&*ev0)? * 1e3 / args.iters as f64;
        boot.barrier()?;
        let mut got = host_bytes(size, "the received bytes' host copy")?;
        stream.read_to_host(&mut got, &bufs.dst.slice(..size)?)?;
        let expect = pattern(peer, size, size);
        let wrong = got.iter().zip(&expect).filter(|(a, b)| a != b).count() as u64;
        let mut msg = us.to_le_bytes().to_vec();
        msg.extend_from_slice(&wrong.to_le_bytes());
        let all = boot.all_gather(&msg)?;
        let (mut worst, mut total) = (0f64, 0u64);
        for m in &all {
            let b: [u8; 16] = m.as_slice().try_into().map_err(|_| {
                Error::malformed("perf result", format!("{} bytes instead of 16", m.len()))
            })?;
            let (t, w) = b.split_at(8);
            worst = worst.max(f64::from_le_bytes(t.try_into().unwrap_or([0; 8])));
            total += u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        }
        let one_way = size as f64 / worst / 1e3;
        table.row(&Row {
            bench: name,
            bytes: size,
            count: size,
            dtype: "u8",
            op: "put",
            root: None,
            nranks: 2,
            time_us: worst,
            cpu_us: None,
            algbw_gbps: one_way,
            busbw_gbps: one_way * 2.0,
            wrong: Some(total),
            baseline: None,
            algo: None,
        });
    }
    table.footer();
    Ok(table.wrong_total())
}

fn check_two(comm: &Communicator) -> Result<()> {
    if comm.nranks() != 2 {
        return Err(Error::invalid(format!(
            "channel benchmarks run between 2 ranks, not {} (use --ranks 2)",
            comm.nranks()
        )));
    }
    Ok(())
}

fn preamble(args: &Args, comm: &Communicator, name: &'static str, what: &str) -> Result<Table> {
    let info = comm.device().info();
    let mut table = Table::new(args.json_out(), comm.rank() == 0, false);
    table.preamble(
        &format!(
            "mscclpp-perf {what}: 2 ranks on the {} backend ({}); both directions at once",
            info.backend, info.name
        ),
        &Meta {
            bench: name,
            backend: info.backend.to_string(),
            device: info.name.clone(),
            nranks: 2,
            timing: "one launch of all timed rounds".into(),
        },
    )?;
    let mut legend = vec![
        format!(
            "time(us): microseconds per round (each rank puts size bytes into the other, signals and waits), the mean over {} rounds of one launch after {} warm-up, the slowest rank's",
            args.iters, args.warmup
        ),
        "algbw = size / time, one direction; busbw = both directions together (GB/s = 1e9 B/s); type u8, op put; #wrong: bytes that differ from what the peer sent".to_string(),
    ];
    if info.backend == BackendKind::Host {
        legend.push(HOST_LEGEND.into());
    }
    table.legend(&legend);
    table.header();
    Ok(table)
}

/// `memory-channel`: the device copies into the peer's mapped memory.
pub fn run_memory_channel(args: &Args, comm: &Communicator) -> Result<u64> {
    check_two(comm)?;
    let device = comm.device();
    let peer = 1 - comm.rank();
    let max = *args
        .sizes()
        .last()
        .ok_or_else(|| Error::invalid("no sizes"))?;
    let bufs = buffers(device, max)?;
    let conn = comm.connect(peer, EndpointConfig::new(Transport::CudaIpc))?;
    let sem = Arc::new(MemoryDevice2DeviceSemaphore::new(comm, &conn)?);
    let mine =
        comm.register_memory(&bufs.dst.full(), TransportFlags::single(Transport::CudaIpc))?;
    let theirs = Arc::new(comm.exchange_memory(&mine, peer)?);
    let chan = MemoryChannel::new(sem, theirs, bufs.src.full(), None)?;
    let stream = device.create_stream()?;
    let kernel = DynKernel::<MemoryChannelPutArgs>::load(&**device, &MODULE, MEMORY_CHANNEL_PUT)?;
    let info = device.info();
    // GPUs: one block of 1024 threads per SM, all resident (the kernel synchronises the grid);
    // the host backend: one single-thread block per core.
    let (blocks, threads) = if info.warp_size == 1 {
        (info.multiprocessors.clamp(1, 32), 1)
    } else {
        (
            info.multiprocessors.clamp(1, 132),
            1024.min(info.max_threads_per_block),
        )
    };
    let mut table = preamble(
        args,
        comm,
        "memory-channel",
        &format!(
            "memory-channel put ({})",
            if info.backend == BackendKind::Host {
                "the CPU copies into the peer's shared memory"
            } else {
                "the device copies into the peer's mapped memory"
            }
        ),
    )?;
    let launch = |size: usize, iters: u64| {
        let a = MemoryChannelPutArgs {
            chan: chan.device_handle(),
            bytes: size as u64,
            iters,
        };
        // SAFETY: the channel and buffers outlive the launch (synchronised in `measure`); `size`
        // is within both buffers.
        unsafe { kernel.launch(&*stream, LaunchConfig::linear(blocks, threads), &a) }
    };
    measure(
        args,
        comm,
        &stream,
        &bufs,
        "memory-channel",
        &mut table,
        &launch,
    )
}

/// `port-channel`: the proxy moves the data over a connection of `transport`.
pub fn run_port_channel(args: &Args, comm: &Communicator, transport: Transport) -> Result<u64> {
    check_two(comm)?;
    let device = comm.device();
    let peer = 1 - comm.rank();
    let max = *args
        .sizes()
        .last()
        .ok_or_else(|| Error::invalid("no sizes"))?;
    let bufs = buffers(device, max)?;
    let flags = TransportFlags::single(transport);
    let conn = comm.connect(peer, EndpointConfig::new(transport))?;
    let sem = Arc::new(Host2DeviceSemaphore::new(comm, conn)?);
    let mine = comm.register_memory(&bufs.dst.full(), flags)?;
    let theirs = Arc::new(comm.exchange_memory(&mine, peer)?);
    let src = Arc::new(comm.register_memory(&bufs.src.full(), flags)?);
    let mut service = ProxyService::new(device, 512)?;
    let sid = service.add_semaphore(sem)?;
    let d = service.add_memory(theirs)?;
    let s = service.add_memory(src)?;
    let handle = service.port_channel(sid, d, s)?;
    service.start()?;
    let stream = device.create_stream()?;
    let kernel = DynKernel::<PortChannelPutArgs>::load(&**device, &MODULE, PORT_CHANNEL_PUT)?;
    let mut table = preamble(
        args,
        comm,
        "port-channel",
        &format!(
            "port-channel put over {}, moved by the host proxy",
            transport.carrier(device.info().backend)
        ),
    )?;
    let launch = |size: usize, iters: u64| {
        let a = PortChannelPutArgs {
            chan: handle,
            bytes: size as u64,
            iters,
        };
        // SAFETY: the service (FIFO, semaphores, memories) outlives the launch.
        unsafe { kernel.launch(&*stream, LaunchConfig::linear(1, 1), &a) }
    };
    let wrong = measure(
        args,
        comm,
        &stream,
        &bufs,
        "port-channel",
        &mut table,
        &launch,
    );
    let stopped = service.stop();
    let wrong = wrong?;
    stopped?;
    Ok(wrong)
}
