//! The IB transport above the verbs calls, against `FakeVerbs` (a FAKE, in-process loopback
//! verbs table: see `fake.rs`), plus the real library's absence on machines without rdma-core.
//!
//! Which verbs paths each test drives:
//! - `no_hca_*`, `hca_list_*`, `port_down_*`: ibv_get_device_list / device names, ibv_open_device,
//!   ibv_query_port (state), ibv_close_device on the error path.
//! - `atomic_write_signal_flush`: ibv_alloc_pd, ibv_create_cq, ibv_create_qp, ibv_modify_qp
//!   INIT→RTR→RTS, ibv_reg_mr (sources, destinations, the scratch slots), ibv_post_send
//!   (RDMA_WRITE, ATOMIC_FETCH_AND_ADD), ibv_poll_cq, teardown (destroy/dereg/dealloc/close).
//! - `no_atomic_signals_by_write_with_imm`: ibv_post_recv, RDMA_WRITE_WITH_IMM, the receive CQ.
//! - `send_queue_full_waits_by_polling`: posting past max_send_wr.
//! - `dead_peer_is_named`, `stale_key_is_named`: failed completions (retry exceeded, remote
//!   access) and the QP's flushed requests after them.
//! - `registration_failure_names_the_device`: ibv_reg_mr failing.

use std::sync::Arc;
use std::time::Duration;

use mscclpp_hal::{DeviceBuffer, Error, MemoryKind};

use super::device::{IbDevice, parse_hca_list};
use super::fake::FakeVerbs;
use crate::test_util::host_ctx;
use crate::*;

fn ib_pair(
    fab: &Arc<FakeVerbs>,
    cfg: EndpointConfig,
) -> ([Arc<TransportContext>; 2], [AnyConnection; 2]) {
    pair_over(Some(fab), cfg)
}

/// Two ranks connected over IB0: through `fab`, or through the real libibverbs when `None`.
fn pair_over(
    fab: Option<&Arc<FakeVerbs>>,
    cfg: EndpointConfig,
) -> ([Arc<TransportContext>; 2], [AnyConnection; 2]) {
    let ctx = [host_ctx(0), host_ctx(1)];
    for c in &ctx {
        if let Some(f) = fab {
            c.use_verbs(f.clone());
        }
    }
    let conn = connect_pair(&ctx, cfg);
    (ctx, conn)
}

/// Connects IB endpoints of the two contexts.
fn connect_pair(ctx: &[Arc<TransportContext>; 2], cfg: EndpointConfig) -> [AnyConnection; 2] {
    let l0 = Endpoint::new(&ctx[0], cfg.clone()).unwrap();
    let l1 = Endpoint::new(&ctx[1], cfg).unwrap();
    let e0 = Endpoint::from_bytes(&l0.to_bytes()).unwrap();
    let e1 = Endpoint::from_bytes(&l1.to_bytes()).unwrap();
    assert!(e0.ib.is_some() && e0.ib != e1.ib);
    let t1 = std::thread::spawn(move || connect(l1, &e0));
    let c0 = connect(l0, &e1).unwrap();
    let c1 = t1.join().unwrap().unwrap();
    assert_eq!(c0.transport(), Transport::Ib(0));
    [c0, c1]
}

fn cfg() -> EndpointConfig {
    let mut c = EndpointConfig::new(Transport::Ib(0));
    c.connect_timeout = Duration::from_secs(10);
    c
}

fn alloc(ctx: &TransportContext, n: usize, fill: u8) -> DeviceBuffer {
    let b = ctx.device().alloc(n, MemoryKind::Device).unwrap();
    let s = ctx.device().create_stream().unwrap();
    s.fill(&b.full(), fill).unwrap();
    s.synchronize().unwrap();
    b
}

fn read(ctx: &TransportContext, b: &DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; b.len()];
    let s = ctx.device().create_stream().unwrap();
    s.read_to_host(&mut out, &b.full()).unwrap();
    out
}

fn u64_at(bytes: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(bytes[off..off + 8].try_into().unwrap())
}

/// Source on rank 0 (a pattern), destination on rank 1 (0xA5), the destination as rank 0 sees it.
fn buffers(
    ctx: &[Arc<TransportContext>; 2],
    n: usize,
) -> (
    DeviceBuffer,
    RegisteredMemory,
    DeviceBuffer,
    RegisteredMemory,
    RegisteredMemory,
    Vec<u8>,
) {
    let flags = TransportFlags::from(Transport::Ib(0));
    let dst = alloc(&ctx[1], n + 64, 0xA5);
    let dst_reg = RegisteredMemory::register(&ctx[1], &dst.full(), flags).unwrap();
    let src = alloc(&ctx[0], n, 0);
    let pattern: Vec<u8> = (0..n as u32).map(|i| (i * 7 + 3) as u8).collect();
    let s = ctx[0].device().create_stream().unwrap();
    s.write_from_host(&src.full(), &pattern).unwrap();
    let src_reg = RegisteredMemory::register(&ctx[0], &src.full(), flags).unwrap();
    let remote = RegisteredMemory::from_bytes(&ctx[0], &dst_reg.to_bytes()).unwrap();
    assert_eq!(remote.to_bytes(), dst_reg.to_bytes());
    (dst, dst_reg, src, src_reg, remote, pattern)
}

#[test]
fn no_hca_on_this_machine_is_a_clear_error() {
    // Without an override the real libibverbs is asked: on CI it is absent or lists nothing.
    let ctx = host_ctx(0);
    match Endpoint::new(&ctx, EndpointConfig::new(Transport::Ib(0))) {
        Err(e) => {
            let m = e.to_string();
            eprintln!("IB0 on this machine: {m}");
            assert!(
                m.contains("IB0") && m.contains("no RDMA device found ("),
                "{m}"
            );
            assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
            if super::verbs::real().is_err() {
                assert!(
                    m.contains("libibverbs could not be loaded (tried libibverbs.so.1: "),
                    "{m}"
                );
            }
        }
        Ok(_) => eprintln!("skipped: this machine has an RDMA device, so IB0 opens"),
    }
}

#[test]
fn no_hca_in_the_list_and_too_few_devices() {
    let ctx = host_ctx(0);
    ctx.use_verbs(FakeVerbs::with_devices(&[]));
    let e = ctx.ib_device(0).unwrap_err().to_string();
    assert!(
        e.contains("no RDMA device found (") && e.contains("lists no device"),
        "{e}"
    );

    let ctx = host_ctx(0);
    ctx.use_verbs(FakeVerbs::with_devices(&["mlx5_0"]));
    assert_eq!(ctx.ib_device(0).unwrap().name, "mlx5_0");
    let e = ctx.ib_device(1).unwrap_err().to_string();
    assert!(
        e.contains("IB1") && e.contains("1 device(s): mlx5_0"),
        "{e}"
    );
}

#[test]
fn hca_list_maps_ibn_to_its_entry() {
    let fab = FakeVerbs::with_devices(&["mlx5_0", "mlx5_1"]);
    let d0 = IbDevice::open(fab.clone(), 0, Some("mlx5_1,mlx5_0")).unwrap();
    assert_eq!((d0.name.as_str(), d0.port), ("mlx5_1", 1));
    let d1 = IbDevice::open(fab.clone(), 1, Some("mlx5_1, mlx5_0:1")).unwrap();
    assert_eq!(d1.name, "mlx5_0");
    let e = IbDevice::open(fab.clone(), 0, Some("mlx5_9"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no RDMA device found (")
            && e.contains("\"mlx5_9\"")
            && e.contains("mlx5_0, mlx5_1"),
        "{e}"
    );
    let e = IbDevice::open(fab.clone(), 2, Some("mlx5_0,mlx5_1"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("MSCCLPP_HCA_DEVICES") && e.contains("2 entries"),
        "{e}"
    );
    let e = IbDevice::open(fab.clone(), 0, Some("mlx5_0:2"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("opening IB0 (mlx5_0)"), "{e}");
    drop((d0, d1));
    assert_eq!(fab.live(), [0; 5], "every context and PD is released");

    assert_eq!(parse_hca_list("a,b:2").unwrap()[1].port, Some(2));
    for bad in ["a,,b", "a:0", "a:x", ""] {
        let e = parse_hca_list(bad).unwrap_err().to_string();
        assert!(
            e.contains("MSCCLPP_HCA_DEVICES") && e.contains("malformed"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn port_down_is_named() {
    let fab = FakeVerbs::with_port_state(&["mlx5_0"], 1);
    let e = IbDevice::open(fab.clone(), 0, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ACTIVE port on mlx5_0") && e.contains("port 1 is DOWN"),
        "{e}"
    );
    assert_eq!(fab.live(), [0; 5]);
}

#[test]
fn atomic_write_signal_flush() {
    let fab = FakeVerbs::with_devices(&["mlx5_0"]);
    {
        let (ctx, conn) = ib_pair(&fab, cfg());
        let (dst, _dst_reg, _src, src_reg, remote, pattern) = buffers(&ctx, 200_000);
        let c = &conn[0];
        c.write(&remote, 1000, &src_reg, 50, 150_000).unwrap();
        // Tokens only grow: each signal adds the difference to the last value sent.
        for v in [5u64, 9, 42] {
            c.update_and_sync(&remote, 200_000, v).unwrap();
        }
        c.flush(Duration::from_secs(5)).unwrap();
        let got = read(&ctx[1], &dst);
        assert!(got[..1000].iter().all(|&b| b == 0xA5));
        assert_eq!(&got[1000..151_000], &pattern[50..150_050]);
        assert!(got[151_000..200_000].iter().all(|&b| b == 0xA5));
        assert_eq!(
            u64_at(&got, 200_000),
            0xA5A5_A5A5_A5A5_A5A5u64.wrapping_add(42)
        );

        // The reverse direction over the other connection.
        let back = alloc(&ctx[0], 64, 0);
        let back_reg =
            RegisteredMemory::register(&ctx[0], &back.full(), Transport::Ib(0).into()).unwrap();
        let back_remote = RegisteredMemory::from_bytes(&ctx[1], &back_reg.to_bytes()).unwrap();
        conn[1].update_and_sync(&back_remote, 8, 7).unwrap();
        conn[1].flush(Duration::from_secs(5)).unwrap();
        assert_eq!(u64_at(&read(&ctx[0], &back), 8), 7);

        // Misuse is refused before anything is posted.
        let e = c
            .write(&remote, 199_999, &src_reg, 0, 100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("exceeds"), "{e}");
        let e = c.update_and_sync(&remote, 4, 1).unwrap_err().to_string();
        assert!(e.contains("aligned"), "{e}");
        let eth = alloc(&ctx[1], 64, 0);
        let eth_reg =
            RegisteredMemory::register(&ctx[1], &eth.full(), Transport::Ethernet.into()).unwrap();
        let eth_remote = RegisteredMemory::from_bytes(&ctx[0], &eth_reg.to_bytes()).unwrap();
        let e = c
            .update_and_sync(&eth_remote, 0, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not IB0"), "{e}");
    }
    assert_eq!(
        fab.live(),
        [0; 5],
        "connections and registrations release every verbs object"
    );
}

#[test]
fn no_atomic_signals_by_write_with_imm() {
    let fab = FakeVerbs::with_devices(&["mlx5_0"]);
    let mut c = cfg();
    c.ib_no_atomic = true;
    c.ib_max_recv_wr = 4;
    let (ctx, conn) = ib_pair(&fab, c);
    let (dst, _dst_reg, _src, src_reg, remote, pattern) = buffers(&ctx, 4096);
    // More signals than receives posted: the peer's receive thread must repost them.
    for v in 1..=40u64 {
        conn[0].write(&remote, 0, &src_reg, 0, 4096).unwrap();
        conn[0].update_and_sync(&remote, 4096, v * 3).unwrap();
        conn[0].flush(Duration::from_secs(5)).unwrap();
        let got = read(&ctx[1], &dst);
        assert_eq!(u64_at(&got, 4096), v * 3);
        assert_eq!(&got[..4096], &pattern[..]);
        // Let the receive thread catch up so that the next signal finds a receive.
        let qpn = qpn_of(&conn[1]);
        let t = std::time::Instant::now();
        while fab.posted_recvs(qpn) < 4 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    // Both ends must agree on the mode.
    let ctx2 = [host_ctx(0), host_ctx(1)];
    for x in &ctx2 {
        x.use_verbs(fab.clone());
    }
    let mut a = cfg();
    a.ib_no_atomic = true;
    let l0 = Endpoint::new(&ctx2[0], a).unwrap();
    let l1 = Endpoint::new(&ctx2[1], cfg()).unwrap();
    let e = connect(l0, &Endpoint::from_bytes(&l1.to_bytes()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 1") && e.contains("no-atomic"), "{e}");
}

fn qpn_of(c: &AnyConnection) -> u32 {
    match c {
        AnyConnection::Ib(ib) => ib.qpn(),
        _ => panic!("not IB"),
    }
}

#[test]
fn send_queue_full_waits_by_polling() {
    let fab = FakeVerbs::with_devices(&["mlx5_0"]);
    let mut c = cfg();
    c.ib_max_send_wr = 2;
    c.ib_max_cq_poll_num = 1;
    let (ctx, conn) = ib_pair(&fab, c);
    let (dst, _d, _s, src_reg, remote, pattern) = buffers(&ctx, 1000);
    for i in 0..50u64 {
        conn[0]
            .write(&remote, i * 20, &src_reg, i * 20, 20)
            .unwrap();
        conn[0].update_and_sync(&remote, 1000, i + 1).unwrap();
    }
    conn[0].flush(Duration::from_secs(5)).unwrap();
    let got = read(&ctx[1], &dst);
    assert_eq!(&got[..1000], &pattern[..]);
}

#[test]
fn dead_peer_is_named() {
    let fab = FakeVerbs::with_devices(&["mlx5_0"]);
    let (ctx, conn) = ib_pair(&fab, cfg());
    let (_d, _dr, _s, src_reg, remote, _p) = buffers(&ctx, 256);
    fab.kill_qp(qpn_of(&conn[1]));
    conn[0].write(&remote, 0, &src_reg, 0, 256).unwrap();
    conn[0].write(&remote, 0, &src_reg, 0, 256).unwrap();
    let e = conn[0].flush(Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, Error::Remote { rank: 1, .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("rank 1") && m.contains("IB0 (mlx5_0") && m.contains("retry counter exceeded"),
        "{m}"
    );
    // The connection stays failed, naming the peer, without posting again.
    let again = conn[0].write(&remote, 0, &src_reg, 0, 8).unwrap_err();
    assert!(matches!(again, Error::Remote { rank: 1, .. }), "{again:?}");
}

#[test]
fn stale_key_is_named() {
    let fab = FakeVerbs::with_devices(&["mlx5_0"]);
    let (ctx, conn) = ib_pair(&fab, cfg());
    let (_d, dst_reg, _s, src_reg, remote, _p) = buffers(&ctx, 256);
    drop(dst_reg); // rank 1 deregisters; rank 0 still holds the old key
    conn[0].write(&remote, 0, &src_reg, 0, 256).unwrap();
    let m = conn[0]
        .flush(Duration::from_secs(5))
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("rank 1")
            && m.contains("remote access error")
            && m.contains("refused the access"),
        "{m}"
    );
}

#[test]
fn registration_failure_names_the_device() {
    let fab = FakeVerbs::with_devices(&["mlx5_0"]);
    let ctx = host_ctx(0);
    ctx.use_verbs(fab.clone());
    fab.fail_registrations();
    let b = alloc(&ctx, 64, 0);
    let e = RegisteredMemory::register(&ctx, &b.full(), Transport::Ib(0).into())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("host memory") && e.contains("IB0 (mlx5_0)"),
        "{e}"
    );
}

#[test]
fn malformed_qp_info_is_refused() {
    let ctx = host_ctx(0);
    ctx.use_verbs(FakeVerbs::with_devices(&["mlx5_0"]));
    let l = Endpoint::new(&ctx, cfg()).unwrap();
    let mut b = l.to_bytes();
    let n = b.len();
    // The QP info ends the encoding: QPN(4) PSN(4) LID(2) GID(16) MTU(1) flags(1).
    b[n - 28..n - 24].copy_from_slice(&0u32.to_le_bytes());
    let e = Endpoint::from_bytes(&b).unwrap_err().to_string();
    assert!(e.contains("QPN 0"), "{e}");
    assert!(Endpoint::from_bytes(&b[..n - 1]).is_err());
}

/// The real verbs path end to end, where this machine has an HCA with an ACTIVE port (skipped
/// with the reason otherwise): two ranks in this process, one RC QP each on IB0 (honouring
/// `MSCCLPP_HCA_DEVICES`), joined through the HCA's loopback; RDMA write, atomic fetch-add,
/// flush by CQ polling, then write-with-immediate in no-atomic mode. On RoCE set
/// `MSCCLPP_TEST_IB_GID_INDEX` to the RoCEv2 GID entry (`show_gids`).
#[test]
fn real_hca_loopback() {
    if let Err(why) = super::verbs::real() {
        eprintln!("skipped: {why}");
        return;
    }
    if let Err(e) = host_ctx(0).ib_device(0) {
        eprintln!("skipped: {e}");
        return;
    }
    let gid = std::env::var("MSCCLPP_TEST_IB_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for no_atomic in [false, true] {
        let mut c = cfg();
        c.ib_gid_index = gid;
        c.ib_no_atomic = no_atomic;
        let (ctx, conn) = pair_over(None, c);
        let (dst, _dr, _s, src_reg, remote, pattern) = buffers(&ctx, 1 << 20);
        conn[0].write(&remote, 0, &src_reg, 0, 1 << 20).unwrap();
        conn[0].update_and_sync(&remote, 1 << 20, 0x1234).unwrap();
        conn[0].flush(Duration::from_secs(10)).unwrap();
        let got = read(&ctx[1], &dst);
        assert_eq!(&got[..1 << 20], &pattern[..], "no_atomic={no_atomic}");
        let token = u64_at(&got, 1 << 20);
        let want = if no_atomic {
            0x1234
        } else {
            0xA5A5_A5A5_A5A5_A5A5u64.wrapping_add(0x1234)
        };
        assert_eq!(token, want, "no_atomic={no_atomic}");
        eprintln!("real HCA loopback passed (no_atomic={no_atomic})");
    }
}

#[test]
fn closed_peer_is_noticed_without_posting() {
    let fab = FakeVerbs::with_devices(&["mlx5_0"]);
    let (_ctx, [c0, c1]) = ib_pair(&fab, cfg());
    drop(c1);
    let t = std::time::Instant::now();
    let e = loop {
        match c0.flush(Duration::from_secs(1)) {
            Err(e) => break e,
            Ok(()) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Ok(()) => panic!("rank 1 closed its side 5 s ago and rank 0 has not noticed"),
        }
    };
    assert!(matches!(e, Error::Remote { rank: 1, .. }), "{e:?}");
}

/// GPU memory through the real HCA (peer memory), where this machine has CUDA and an HCA
/// (skipped with the reason otherwise): two ranks on GPU 0 in this process; an RDMA write of
/// 1 MiB of device memory into device memory and an atomic signal, read back through CUDA. Where
/// peer memory is missing (no nvidia-peermem), registration must fail with the error that says
/// so, and the test reports that instead.
#[test]
fn gpu_memory_over_real_hca() {
    let backend = match mscclpp_cuda::probe() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("skipped: no CUDA here ({e})");
            return;
        }
    };
    if let Err(why) = super::verbs::real() {
        eprintln!("skipped: {why}");
        return;
    }
    let dev = backend.open_device(0).unwrap();
    let ctx = [
        TransportContext::new(0, dev.clone()),
        TransportContext::new(1, dev.clone()),
    ];
    if let Err(e) = ctx[0].ib_device(0) {
        eprintln!("skipped: {e}");
        return;
    }
    let n = 1usize << 20;
    let flags = TransportFlags::from(Transport::Ib(0));
    let src = alloc(&ctx[0], n, 0);
    let pattern: Vec<u8> = (0..n as u32).map(|i| (i * 13 + 1) as u8).collect();
    let s = dev.create_stream().unwrap();
    s.write_from_host(&src.full(), &pattern).unwrap();
    s.synchronize().unwrap();
    let dst = alloc(&ctx[1], n + 8, 0);
    let dst_reg = match RegisteredMemory::register(&ctx[1], &dst.full(), flags) {
        Ok(r) => r,
        Err(e) => {
            let m = e.to_string();
            assert!(
                m.contains("device memory") && m.contains("nvidia-peermem"),
                "{m}"
            );
            eprintln!("GPU memory cannot be registered here, with the clear error: {m}");
            return;
        }
    };
    let src_reg = RegisteredMemory::register(&ctx[0], &src.full(), flags).unwrap();
    let mut c = cfg();
    c.ib_gid_index = std::env::var("MSCCLPP_TEST_IB_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let conn = connect_pair(&ctx, c);
    let remote = RegisteredMemory::from_bytes(&ctx[0], &dst_reg.to_bytes()).unwrap();
    conn[0].write(&remote, 0, &src_reg, 0, n as u64).unwrap();
    conn[0].update_and_sync(&remote, n as u64, 77).unwrap();
    conn[0].flush(Duration::from_secs(10)).unwrap();
    let got = read(&ctx[1], &dst);
    assert_eq!(&got[..n], &pattern[..]);
    assert_eq!(u64_at(&got, n), 77);
    eprintln!("GPU memory over the real HCA passed (1 MiB write, atomic signal)");
}
