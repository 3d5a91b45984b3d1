//! Channels between two ranks as separate processes on the host backend: memory channels
//! (signal/wait ping-pong, put/get/read/write, LL16 and LL8 packets), port channels through the
//! proxy service over CudaIpc and Ethernet, switch channels on the emulated multicast, and a
//! custom proxy. Device code runs inside real kernel launches (`devcode`).
//! Runs with `cargo test -p mscclpp-conformance --test channels`.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};
use mscclpp::comm::Communicator;
use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot, UniqueId};
use mscclpp::comm::channel::{BaseMemoryChannel, MemoryChannel, SwitchChannel};
use mscclpp::comm::proxy::{Fifo, Proxy, ProxyHandlerResult, ProxyService};
use mscclpp::comm::semaphore::{
    Host2DeviceSemaphore, Host2HostSemaphore, MemoryDevice2DeviceSemaphore,
};
use mscclpp::hal::ReduceOp;
use mscclpp::hal::dev::packet::PacketKind;
use mscclpp::hal::dev::{ProxyTrigger, TriggerType};
use mscclpp::hal::{BackendKind, Device, IpcHandle, LaunchConfig, MemoryKind, Stream};
use mscclpp::transports::{Connection, EndpointConfig, Transport, TransportFlags};
use mscclpp_conformance::devcode;
use mscclpp_conformance::multiproc::{self, ChildOutcome};
use mscclpp_conformance::rng::Rng;

const UID_VAR: &str = "MSCCLPP_TEST_UID";
const T: Duration = Duration::from_secs(30);

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

struct Rank {
    comm: Communicator,
    device: Arc<dyn Device>,
    stream: Arc<dyn Stream>,
    rank: usize,
    peer: usize,
}

fn setup() -> R<Rank> {
    let (rank, n) = multiproc::rank_and_size();
    let uid: UniqueId = std::env::var(UID_VAR).map_err(e)?.parse().map_err(e)?;
    let boot = Arc::new(
        Bootstrap::new(&uid, rank, n, BootstrapConfig::from_env().map_err(e)?).map_err(e)?,
    );
    let backend = mscclpp::registry::probe(BackendKind::Host).map_err(e)?;
    let device = backend.open_device(rank).map_err(e)?;
    let stream = device.create_stream().map_err(e)?;
    Ok(Rank {
        comm: Communicator::new(boot, device.clone()),
        device,
        stream,
        rank,
        peer: 1 - rank,
    })
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

fn download(r: &Rank, s: &mscclpp::hal::BufferSlice) -> R<Vec<u8>> {
    let mut v = vec![0u8; s.len()];
    r.stream.read_to_host(&mut v, s).map_err(e)?;
    Ok(v)
}

fn memory_channel(
    r: &Rank,
    len: usize,
    packet: bool,
) -> R<(
    MemoryChannel,
    mscclpp::hal::DeviceBuffer,
    mscclpp::hal::DeviceBuffer,
)> {
    let conn = r
        .comm
        .connect(r.peer, EndpointConfig::new(Transport::CudaIpc))
        .map_err(e)?;
    let sem = Arc::new(MemoryDevice2DeviceSemaphore::new(&r.comm, &conn).map_err(e)?);
    // `data` is what the peer writes into (mapped there); `src` is what we send from.
    let data = r.device.alloc(len * 2, MemoryKind::Device).map_err(e)?;
    let src = r.device.alloc(len, MemoryKind::Device).map_err(e)?;
    r.stream.fill(&data.full(), 0xA5).map_err(e)?; // poison
    // Before the exchange: once the peer has our memory it may write into it at any time.
    r.stream.synchronize().map_err(e)?;
    let mine = r
        .comm
        .register_memory(&data.full(), TransportFlags::single(Transport::CudaIpc))
        .map_err(e)?;
    let theirs = Arc::new(r.comm.exchange_memory(&mine, r.peer).map_err(e)?);
    let packets = if packet { Some(data.full()) } else { None };
    let ch = MemoryChannel::new(sem, theirs, src.full(), packets).map_err(e)?;
    r.stream.synchronize().map_err(e)?;
    Ok((ch, data, src))
}

// ---------------------------------------------------------------------------------------------

fn role_ping_pong() -> R<()> {
    let r = setup()?;
    let conn = r
        .comm
        .connect(r.peer, EndpointConfig::new(Transport::CudaIpc))
        .map_err(e)?;
    let sem = Arc::new(MemoryDevice2DeviceSemaphore::new(&r.comm, &conn).map_err(e)?);
    let channel = BaseMemoryChannel::new(sem); // owns the tokens the handle points at
    let ch = channel.device_handle();
    const ROUNDS: u64 = 20_000;
    let initiator = r.rank == 0;
    r.comm.bootstrap().barrier().map_err(e)?;
    let t = Instant::now();
    devcode::launch(
        &r.device,
        &*r.stream,
        LaunchConfig::linear(1, 1),
        move |_, _| {
            for _ in 0..ROUNDS {
                // SAFETY: the handle's tokens live as long as `channel`, dropped after synchronize.
                unsafe {
                    if initiator {
                        ch.signal();
                        ch.wait(T)?;
                    } else {
                        ch.wait(T)?;
                        ch.signal();
                    }
                }
            }
            Ok(())
        },
    )
    .map_err(e)?;
    r.stream.synchronize_timeout(T * 2).map_err(e)?;
    let us = t.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64;
    // relaxed variants and poll: one more exchange each
    devcode::launch(
        &r.device,
        &*r.stream,
        LaunchConfig::linear(1, 1),
        move |_, _| {
            // SAFETY: as above.
            unsafe {
                if initiator {
                    ch.relaxed_signal();
                    ch.relaxed_wait(T)?;
                } else {
                    let start = Instant::now();
                    while !ch.poll() {
                        if start.elapsed() > T {
                            return Err(mscclpp::Error::invalid("poll never saw the signal"));
                        }
                        std::hint::spin_loop();
                    }
                    ch.relaxed_signal();
                }
            }
            Ok(())
        },
    )
    .map_err(e)?;
    r.stream.synchronize_timeout(T).map_err(e)?;
    multiproc::report("round_trip_us", format!("{us:.2}"));
    r.comm.bootstrap().barrier().map_err(e)?;
    drop(channel);
    Ok(())
}

fn role_put_get_read_write() -> R<()> {
    let r = setup()?;
    const LEN: usize = (1 << 20) + 12; // not a multiple of 16: tails are handled
    let (ch, data, src) = memory_channel(&r, LEN, false)?;
    let h = ch.device_handle();
    let mine = pattern(r.rank as u64 + 1, LEN);
    r.stream.write_from_host(&src.full(), &mine).map_err(e)?;
    // put: 4 blocks x 8 "threads", each (block, thread) copying its share, then one signal.
    let cfg = LaunchConfig::linear(4, 8);
    devcode::launch(&r.device, &*r.stream, cfg, move |cfg, b| {
        let n = (cfg.num_blocks() * cfg.threads_per_block()) as usize;
        for t in 0..cfg.threads_per_block() as usize {
            let tid = b as usize * cfg.threads_per_block() as usize + t;
            // SAFETY: ranges within the registered memories (LEN of src, 2*LEN of dst).
            unsafe { h.put(7, 0, LEN, tid, n) };
        }
        Ok(())
    })
    .map_err(e)?;
    devcode::launch(
        &r.device,
        &*r.stream,
        LaunchConfig::linear(1, 1),
        move |_, _| {
            // SAFETY: semaphore tokens alive with the channel.
            unsafe {
                h.signal();
                h.wait(T)
            }
        },
    )
    .map_err(e)?;
    r.stream.synchronize_timeout(T).map_err(e)?;
    let got = download(&r, &data.slice(..LEN + 14).map_err(e)?)?;
    let theirs = pattern(r.peer as u64 + 1, LEN);
    if got[..7] != [0xA5; 7] || got[7 + LEN..] != [0xA5; 7] {
        return Err("put wrote outside its range".into());
    }
    if got[7..7 + LEN] != theirs[..] {
        return Err("put data wrong".into());
    }
    r.comm.bootstrap().barrier().map_err(e)?;
    // get: read the peer's `data` (which now holds our pattern at 7..) into our src
    r.stream.fill(&src.full(), 0).map_err(e)?;
    devcode::launch(
        &r.device,
        &*r.stream,
        LaunchConfig::linear(2, 4),
        move |cfg, b| {
            for t in 0..4usize {
                // SAFETY: as above.
                unsafe {
                    h.get(
                        7,
                        0,
                        LEN,
                        b as usize * 4 + t,
                        (cfg.num_blocks() * 4) as usize,
                    )
                };
            }
            Ok(())
        },
    )
    .map_err(e)?;
    r.stream.synchronize_timeout(T).map_err(e)?;
    if download(&r, &src.full())? != mine {
        return Err("get did not read back what this rank put".into());
    }
    r.comm.bootstrap().barrier().map_err(e)?;
    // write / read single elements
    let rank = r.rank as u64;
    devcode::launch(
        &r.device,
        &*r.stream,
        LaunchConfig::linear(1, 1),
        move |_, _| {
            // SAFETY: index within the peer's registered memory, 8-aligned.
            unsafe {
                h.write::<u64>(LEN / 8 + 1, 0xF00D_0000 + rank);
                h.signal();
                h.wait(T)?;
            }
            Ok(())
        },
    )
    .map_err(e)?;
    r.stream.synchronize_timeout(T).map_err(e)?;
    r.comm.bootstrap().barrier().map_err(e)?;
    let peer = r.peer as u64;
    let (tx, rx) = std::sync::mpsc::channel();
    devcode::launch(
        &r.device,
        &*r.stream,
        LaunchConfig::linear(1, 1),
        move |_, _| {
            // SAFETY: as above; reads what this rank wrote into the peer.
            let _ = tx.send(unsafe { h.read::<u64>(LEN / 8 + 1) });
            Ok(())
        },
    )
    .map_err(e)?;
    r.stream.synchronize_timeout(T).map_err(e)?;
    let back = rx.recv_timeout(T).map_err(e)?;
    let local = download(
        &r,
        &data
            .slice((LEN / 8 + 1) * 8..(LEN / 8 + 2) * 8)
            .map_err(e)?,
    )?;
    if back != 0xF00D_0000 + rank || local != (0xF00D_0000 + peer).to_le_bytes() {
        return Err(format!("write/read: read back {back:#x}, local {local:?}"));
    }
    r.comm.bootstrap().barrier().map_err(e)?;
    multiproc::report("put_get_read_write", "ok");
    Ok(())
}

fn role_packets() -> R<()> {
    let r = setup()?;
    const LEN: usize = 64 * 1024;
    let (ch, data, src) = memory_channel(&r, LEN, true)?;
    let h = ch.device_handle();
    for (round, kind) in [
        PacketKind::LL16,
        PacketKind::LL8,
        PacketKind::LL16,
        PacketKind::LL8,
    ]
    .into_iter()
    .enumerate()
    {
        let flag = round as u32 + 1;
        let mine = pattern(((r.rank as u64) << 8) + round as u64, LEN);
        r.stream.write_from_host(&src.full(), &mine).map_err(e)?;
        // Each rank writes packets into the peer's packet area and reads its own: no signal.
        devcode::launch(
            &r.device,
            &*r.stream,
            LaunchConfig::linear(4, 1),
            move |cfg, b| {
                let n = cfg.num_blocks() as usize;
                // SAFETY: LEN data bytes of src, 2*LEN packet bytes of the peer's area.
                unsafe { h.put_packets(kind, 0, 0, LEN, flag, b as usize, n) }
            },
        )
        .map_err(e)?;
        devcode::launch(
            &r.device,
            &*r.stream,
            LaunchConfig::linear(4, 1),
            move |cfg, b| {
                let n = cfg.num_blocks() as usize;
                // SAFETY: the local packet area (2*LEN) into the local src (LEN).
                unsafe { h.unpack_packets(kind, 0, 0, LEN, flag, b as usize, n, T) }
            },
        )
        .map_err(e)?;
        r.stream.synchronize_timeout(T).map_err(e)?;
        let got = download(&r, &src.full())?;
        let theirs = pattern(((r.peer as u64) << 8) + round as u64, LEN);
        if got != theirs {
            return Err(format!("{kind:?} round {round}: unpacked data differs"));
        }
        r.comm.bootstrap().barrier().map_err(e)?;
    }
    let _ = data;
    multiproc::report("packets", "ok");
    Ok(())
}

fn role_switch() -> R<()> {
    let r = setup()?;
    const LEN: usize = 4096 * 4;
    let boot = r.comm.bootstrap();
    let group = if r.rank == 0 {
        let g = r.device.multicast_create(LEN, 2).map_err(e)?;
        boot.broadcast(0, &g.export().map_err(e)?.to_bytes())
            .map_err(e)?;
        g
    } else {
        let bytes = boot.broadcast(0, &[]).map_err(e)?;
        r.device
            .multicast_import(&IpcHandle::from_bytes(&bytes).map_err(e)?)
            .map_err(e)?
    };
    let buf = r.device.alloc(LEN, MemoryKind::Device).map_err(e)?;
    let vals: Vec<f32> = (0..LEN / 4)
        .map(|i| (i as f32) * (r.rank as f32 + 1.0))
        .collect();
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    r.stream.write_from_host(&buf.full(), &bytes).map_err(e)?;
    group.bind(r.rank, &buf.full()).map_err(e)?;
    let ch = SwitchChannel::new(&r.device, &*group, &buf.full(), T).map_err(e)?;
    let h = ch.device_handle();
    boot.barrier().map_err(e)?;
    // Each rank reduces its half and broadcasts the sum to both members (an allreduce).
    let half = LEN / 2;
    let off = (r.rank * half) as u64;
    let (tx, rx) = std::sync::mpsc::channel();
    devcode::launch(
        &r.device,
        &*r.stream,
        LaunchConfig::linear(1, 1),
        move |_, _| {
            let mut sums = vec![0f32; half / 4];
            // SAFETY: both members are mapped by the channel; range within the group.
            unsafe {
                h.reduce(off, ReduceOp::Sum, &mut sums)?;
                let _ = tx.send(sums.clone());
            }
            Ok(())
        },
    )
    .map_err(e)?;
    r.stream.synchronize_timeout(T).map_err(e)?;
    let sums = rx.recv_timeout(T).map_err(e)?;
    boot.barrier().map_err(e)?; // everyone reduced before anyone overwrites
    devcode::launch(
        &r.device,
        &*r.stream,
        LaunchConfig::linear(1, 1),
        move |_, _| {
            // SAFETY: as above.
            unsafe { h.broadcast(off, &sums) }
        },
    )
    .map_err(e)?;
    r.stream.synchronize_timeout(T).map_err(e)?;
    boot.barrier().map_err(e)?;
    let got = download(&r, &buf.full())?;
    for (i, c) in got.chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        if v != (i as f32) * 3.0 {
            return Err(format!(
                "switch allreduce element {i}: {v}, expected {}",
                i as f32 * 3.0
            ));
        }
    }
    boot.barrier().map_err(e)?;
    multiproc::report("switch", "ok");
    Ok(())
}

fn transport_from_env() -> R<Transport> {
    std::env::var("MSCCLPP_TEST_TRANSPORT")
        .map_err(e)?
        .parse()
        .map_err(e)
}

fn role_port_channel() -> R<()> {
    let r = setup()?;
    let transport = transport_from_env()?;
    const LEN: usize = 3 << 20;
    let conn = r
        .comm
        .connect(r.peer, EndpointConfig::new(transport))
        .map_err(e)?;
    let sem = Arc::new(Host2DeviceSemaphore::new(&r.comm, conn.clone()).map_err(e)?);
    let data = r.device.alloc(LEN, MemoryKind::Device).map_err(e)?;
    let src = r.device.alloc(LEN, MemoryKind::Device).map_err(e)?;
    r.stream.fill(&data.full(), 0xA5).map_err(e)?;
    r.stream.synchronize().map_err(e)?;
    let flags = TransportFlags::single(transport);
    let mine = r.comm.register_memory(&data.full(), flags).map_err(e)?;
    let theirs = r.comm.exchange_memory(&mine, r.peer).map_err(e)?;
    let local_src = r.comm.register_memory(&src.full(), flags).map_err(e)?;
    let mut service = ProxyService::new(&r.device, 64).map_err(e)?;
    let sid = service.add_semaphore(sem).map_err(e)?;
    let dst = service.add_memory(Arc::new(theirs)).map_err(e)?;
    let srcid = service.add_memory(Arc::new(local_src)).map_err(e)?;
    let h = service.port_channel(sid, dst, srcid).map_err(e)?;
    service.start().map_err(e)?;
    let third = LEN / 3;
    for round in 0..3u64 {
        let mine = pattern(((r.rank as u64) << 16) + round, LEN);
        r.stream.write_from_host(&src.full(), &mine).map_err(e)?;
        r.comm.bootstrap().barrier().map_err(e)?;
        let t = Instant::now();
        devcode::launch(
            &r.device,
            &*r.stream,
            LaunchConfig::linear(1, 1),
            move |_, _| {
                let third = third as u64;
                // SAFETY: the FIFO and semaphore outlive the kernel (service dropped at the end).
                unsafe {
                    match round {
                        // put, put, then put with signal
                        0 => {
                            h.put(0, 0, third, T)?;
                            h.put(third, third, third, T)?;
                            h.put_with_signal(2 * third, 2 * third, third, T)?;
                        }
                        // one put with signal and flush
                        1 => h.put_with_signal_and_flush(0, 0, 3 * third, T)?,
                        // puts, flush, then a bare signal
                        _ => {
                            h.put(0, 0, 2 * third, T)?;
                            h.put(2 * third, 2 * third, third, T)?;
                            h.flush(T)?;
                            h.signal(T)?;
                        }
                    }
                    h.wait(T)
                }
            },
        )
        .map_err(e)?;
        r.stream.synchronize_timeout(T).map_err(e)?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        let got = download(&r, &data.full())?;
        let theirs = pattern(((r.peer as u64) << 16) + round, LEN);
        if got != theirs {
            let at = got.iter().zip(&theirs).position(|(a, b)| a != b);
            return Err(format!("{transport} round {round}: data differs at {at:?}"));
        }
        multiproc::report(&format!("round{round}_us"), format!("{us:.0}"));
        r.comm.bootstrap().barrier().map_err(e)?;
    }
    service.stop().map_err(e)?;
    multiproc::report("port_channel", "ok");
    Ok(())
}

fn role_host_semaphore() -> R<()> {
    let r = setup()?;
    let transport = transport_from_env()?;
    let conn = r
        .comm
        .connect(r.peer, EndpointConfig::new(transport))
        .map_err(e)?;
    let sem = Host2HostSemaphore::new(&r.comm, conn).map_err(e)?;
    const ROUNDS: u32 = 500;
    let t = Instant::now();
    for _ in 0..ROUNDS {
        if r.rank == 0 {
            sem.signal().map_err(e)?;
            sem.wait(T).map_err(e)?;
        } else {
            sem.wait(T).map_err(e)?;
            sem.signal().map_err(e)?;
        }
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS);
    if sem.poll() {
        return Err("poll saw a signal that was never sent".into());
    }
    multiproc::report("host_round_trip_us", format!("{us:.1}"));
    Ok(())
}

/// A custom proxy: device code posts FLAG triggers carrying a value in the size field; the
/// user's handler forwards each value to the peer as a token through the connection.
fn role_custom_proxy() -> R<()> {
    let r = setup()?;
    let conn = r
        .comm
        .connect(r.peer, EndpointConfig::new(Transport::Ethernet))
        .map_err(e)?;
    let token = r.device.alloc(8, MemoryKind::HostMapped).map_err(e)?;
    r.stream.fill(&token.full(), 0).map_err(e)?;
    r.stream.synchronize().map_err(e)?;
    let mine = r
        .comm
        .register_memory(&token.full(), TransportFlags::single(Transport::Ethernet))
        .map_err(e)?;
    let theirs = r.comm.exchange_memory(&mine, r.peer).map_err(e)?;
    let fifo = Arc::new(Fifo::new(&r.device, 8).map_err(e)?);
    let fh = fifo.device_handle();
    let conn2 = conn.clone();
    let proxy = Proxy::start(fifo, move |t, _pos| {
        if t.kind() != TriggerType::FLAG {
            return Err(mscclpp::Error::invalid(format!(
                "unexpected trigger kind {}",
                t.kind()
            )));
        }
        conn2.update_and_sync(&theirs, 0, t.size())?;
        Ok(ProxyHandlerResult::Continue)
    })
    .map_err(e)?;
    const N: u64 = 2000;
    devcode::launch(
        &r.device,
        &*r.stream,
        LaunchConfig::linear(1, 1),
        move |_, _| {
            for v in 1..=N {
                let t = ProxyTrigger::new(TriggerType::FLAG, 0, 0, 0, 0, v, 0)?;
                // SAFETY: the FIFO lives in the proxy until it is stopped below.
                unsafe { fh.push(t, T)? };
            }
            Ok(())
        },
    )
    .map_err(e)?;
    r.stream.synchronize_timeout(T).map_err(e)?;
    let p = token.host_ptr().ok_or("no host pointer")?;
    // SAFETY: 8-byte aligned host-mapped word, alive while `token` is; written atomically.
    let word = unsafe { std::sync::atomic::AtomicU64::from_ptr(p.cast::<u64>()) };
    let start = Instant::now();
    while word.load(std::sync::atomic::Ordering::Acquire) != N {
        if start.elapsed() > T {
            return Err(format!(
                "token at {} of {N}",
                word.load(std::sync::atomic::Ordering::Relaxed)
            ));
        }
        std::thread::yield_now();
    }
    r.comm.bootstrap().barrier().map_err(e)?;
    proxy.stop().map_err(e)?;
    multiproc::report("custom_proxy", "ok");
    Ok(())
}

/// Rank 1 is killed while rank 0 streams port-channel puts over Ethernet: rank 0's flush must
/// fail (the proxy reports the dead peer) within the deadline, not hang.
fn role_dead_peer_port_channel() -> R<()> {
    let r = setup()?;
    const LEN: usize = 8 << 20;
    let conn = r
        .comm
        .connect(r.peer, EndpointConfig::new(Transport::Ethernet))
        .map_err(e)?;
    let sem = Arc::new(Host2DeviceSemaphore::new(&r.comm, conn).map_err(e)?);
    let data = r.device.alloc(LEN, MemoryKind::Device).map_err(e)?;
    let flags = TransportFlags::single(Transport::Ethernet);
    let mine = r.comm.register_memory(&data.full(), flags).map_err(e)?;
    let theirs = r.comm.exchange_memory(&mine, r.peer).map_err(e)?;
    if r.rank == 1 {
        r.comm.bootstrap().barrier().map_err(e)?;
        std::thread::sleep(Duration::from_secs(60)); // the parent kills us
        return Ok(());
    }
    let local = r.comm.register_memory(&data.full(), flags).map_err(e)?;
    let mut service = ProxyService::new(&r.device, 64).map_err(e)?;
    let sid = service.add_semaphore(sem).map_err(e)?;
    let d = service.add_memory(Arc::new(theirs)).map_err(e)?;
    let s = service.add_memory(Arc::new(local)).map_err(e)?;
    let h = service.port_channel(sid, d, s).map_err(e)?;
    service.start().map_err(e)?;
    r.comm.bootstrap().barrier().map_err(e)?;
    multiproc::report("streaming", "1");
    let deadline = Duration::from_secs(5);
    let t = Instant::now();
    let result = (|| -> R<()> {
        for _ in 0..10_000 {
            devcode::launch(
                &r.device,
                &*r.stream,
                LaunchConfig::linear(1, 1),
                move |_, _| {
                    // SAFETY: the service outlives the kernel.
                    unsafe {
                        h.put(0, 0, LEN as u64, deadline)?;
                        h.flush(deadline)
                    }
                },
            )
            .map_err(e)?;
            r.stream.synchronize_timeout(deadline * 2).map_err(e)?;
        }
        Ok(())
    })();
    let err = match result {
        Ok(()) => return Err("10000 flushes succeeded with a dead peer".into()),
        Err(msg) => msg,
    };
    let proxy_err = service
        .stop()
        .err()
        .map(|x| x.to_string())
        .unwrap_or_default();
    multiproc::report("failed_after_ms", t.elapsed().as_millis());
    multiproc::report("failed_at_unix_us", unix_us());
    multiproc::report("error", err.replace('\n', " "));
    multiproc::report("proxy_error", proxy_err.replace('\n', " "));
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn run_pair(role: &str, key: &str) -> Result<Vec<ChildOutcome>, Failed> {
    run_pair_env(role, key, &[])
}

fn run_pair_env(
    role: &str,
    key: &str,
    extra: &[(&str, &str)],
) -> Result<Vec<ChildOutcome>, Failed> {
    let cfg = BootstrapConfig {
        timeout: T,
        ..BootstrapConfig::default()
    };
    let (_root, uid) = BootstrapRoot::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), 2, &cfg)?;
    let mut env = vec![
        (UID_VAR.to_string(), uid.to_string()),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT".to_string(), "30".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let outs = multiproc::spawn_ranks(role, 2, &env, Duration::from_secs(120));
    for o in &outs {
        if !o.ok() || !o.reports().contains_key(key) {
            return Err(o.describe().into());
        }
    }
    Ok(outs)
}

fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

fn dead_peer_port_channel() -> Result<(), Failed> {
    let cfg = BootstrapConfig {
        timeout: T,
        ..BootstrapConfig::default()
    };
    let (_root, uid) = BootstrapRoot::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), 2, &cfg)?;
    let env = vec![(UID_VAR.to_string(), uid.to_string())];
    let r0 = multiproc::spawn("dead-peer-port-channel", 0, 2, &env);
    let mut r1 = multiproc::spawn("dead-peer-port-channel", 1, 2, &env);
    std::thread::sleep(Duration::from_millis(1500)); // set-up done, rank 0 streaming
    r1.kill();
    let killed_at = unix_us();
    let o = multiproc::wait(r0, Instant::now() + Duration::from_secs(60));
    let _ = multiproc::wait(r1, Instant::now());
    let rep = o.reports();
    if !o.ok() || !rep.contains_key("error") {
        return Err(o.describe().into());
    }
    if !rep["proxy_error"].contains("rank 1") && !rep["error"].contains("rank 1") {
        return Err(format!(
            "errors do not name rank 1: {} / {}",
            rep["error"], rep["proxy_error"]
        )
        .into());
    }
    let failed_at: u128 = rep
        .get("failed_at_unix_us")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let after_ms = failed_at.saturating_sub(killed_at) / 1000;
    eprintln!(
        "    survivor's device-side flush failed {after_ms} ms after the kill (deadline 5 s); the proxy said: {}",
        rep["proxy_error"]
    );
    if after_ms > 15_000 {
        return Err(format!("survivor took {after_ms} ms").into());
    }
    Ok(())
}

fn main() {
    multiproc::run_child(|role| match role {
        "ping-pong" => role_ping_pong(),
        "put-get-read-write" => role_put_get_read_write(),
        "packets" => role_packets(),
        "switch" => role_switch(),
        "port-channel" => role_port_channel(),
        "host-semaphore" => role_host_semaphore(),
        "custom-proxy" => role_custom_proxy(),
        "dead-peer-port-channel" => role_dead_peer_port_channel(),
        other => Err(format!("unknown role {other}")),
    });
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = vec![
        Trial::test("channels::base_memory_channel_ping_pong", || {
            let outs = run_pair("ping-pong", "round_trip_us")?;
            eprintln!(
                "    signal/wait round trip: {} us (host backend, 2 processes)",
                outs[0].reports()["round_trip_us"]
            );
            Ok(())
        }),
        Trial::test("channels::memory_channel_put_get_read_write", || {
            run_pair("put-get-read-write", "put_get_read_write").map(|_| ())
        }),
        Trial::test("channels::memory_channel_ll16_ll8_packets", || {
            run_pair("packets", "packets").map(|_| ())
        }),
        Trial::test("channels::switch_channel_reduce_broadcast", || {
            run_pair("switch", "switch").map(|_| ())
        }),
        Trial::test("channels::custom_proxy_handler", || {
            run_pair("custom-proxy", "custom_proxy").map(|_| ())
        }),
        Trial::test(
            "channels::port_channel_dead_peer_fails_flush",
            dead_peer_port_channel,
        ),
    ];
    for t in ["CudaIpc", "Ethernet"] {
        trials.push(Trial::test(
            format!("channels::port_channel_put_signal_flush::{t}"),
            move || {
                let outs = run_pair_env(
                    "port-channel",
                    "port_channel",
                    &[("MSCCLPP_TEST_TRANSPORT", t)],
                )?;
                let rep = outs[0].reports();
                eprintln!(
                    "    {t}: 3 MiB rounds took {} / {} / {} us",
                    rep["round0_us"], rep["round1_us"], rep["round2_us"]
                );
                Ok(())
            },
        ));
        trials.push(Trial::test(
            format!("channels::host_to_host_semaphore::{t}"),
            move || {
                let outs = run_pair_env(
                    "host-semaphore",
                    "host_round_trip_us",
                    &[("MSCCLPP_TEST_TRANSPORT", t)],
                )?;
                eprintln!(
                    "    {t}: host signal/wait round trip {} us",
                    outs[0].reports()["host_round_trip_us"]
                );
                Ok(())
            },
        ));
    }
    libtest_mimic::run(&args, trials).exit();
}
