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
use mscclpp::comm::semaphore::MemoryDevice2DeviceSemaphore;
use mscclpp::hal::dev::packet::PacketKind;
use mscclpp::hal::dev::switch_channel::ReduceOp;
use mscclpp::hal::{BackendKind, Device, IpcHandle, LaunchConfig, MemoryKind, Stream};
use mscclpp::transports::{EndpointConfig, Transport, TransportFlags};
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

// ---------------------------------------------------------------------------------------------

fn run_pair(role: &str, key: &str) -> Result<Vec<ChildOutcome>, Failed> {
    let cfg = BootstrapConfig {
        timeout: T,
        ..BootstrapConfig::default()
    };
    let (_root, uid) = BootstrapRoot::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), 2, &cfg)?;
    let env = vec![
        (UID_VAR.to_string(), uid.to_string()),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT".to_string(), "30".to_string()),
    ];
    let outs = multiproc::spawn_ranks(role, 2, &env, Duration::from_secs(120));
    for o in &outs {
        if !o.ok() || !o.reports().contains_key(key) {
            return Err(o.describe().into());
        }
    }
    Ok(outs)
}

fn main() {
    if let Some(role) = multiproc::role() {
        let r = match role.as_str() {
            "ping-pong" => role_ping_pong(),
            "put-get-read-write" => role_put_get_read_write(),
            "packets" => role_packets(),
            "switch" => role_switch(),
            other => Err(format!("unknown role {other}")),
        };
        if let Err(msg) = r {
            eprintln!("rank {}: {msg}", multiproc::rank_and_size().0);
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![
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
    ];
    libtest_mimic::run(&args, trials).exit();
}
