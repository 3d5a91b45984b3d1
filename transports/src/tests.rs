//! Two ranks in one process (threads), over each transport: the behaviour the multi-process
//! suite (`tests/tests/transports.rs`) checks across processes, plus the failure paths that are
//! easier to provoke here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp_hal::{DeviceBuffer, Error, MemoryKind};

use crate::test_util::host_ctx;
use crate::*;

struct Pair {
    ctx: [Arc<TransportContext>; 2],
    conn: [AnyConnection; 2],
}

fn pair(t: Transport) -> Pair {
    let ctx = [host_ctx(0), host_ctx(1)];
    let mut cfg = EndpointConfig::new(t);
    cfg.connect_timeout = Duration::from_secs(10);
    cfg.max_write_chunk = 64 << 10;
    let l0 = Endpoint::new(&ctx[0], cfg.clone()).unwrap();
    let l1 = Endpoint::new(&ctx[1], cfg).unwrap();
    let (e0, e1) = (
        Endpoint::from_bytes(&l0.to_bytes()).unwrap(),
        Endpoint::from_bytes(&l1.to_bytes()).unwrap(),
    );
    let t1 = std::thread::spawn(move || connect(l1, &e0));
    let c0 = connect(l0, &e1).unwrap();
    let c1 = t1.join().unwrap().unwrap();
    assert_eq!(
        (c0.local_rank(), c0.remote_rank(), c0.transport()),
        (0, 1, t)
    );
    Pair {
        ctx,
        conn: [c0, c1],
    }
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

fn token(b: &DeviceBuffer, off: usize) -> u64 {
    let p = b.host_ptr().unwrap().wrapping_add(off);
    // SAFETY: an aligned 8-byte location inside a live host-backend mapping, written by others
    // only with atomic stores.
    unsafe { AtomicU64::from_ptr(p.cast::<u64>()) }.load(Ordering::Acquire)
}

fn write_update_flush(t: Transport) {
    let p = pair(t);
    let flags = TransportFlags::from(t);
    let dst = alloc(&p.ctx[1], 300_008, 0xA5);
    let dst_reg = RegisteredMemory::register(&p.ctx[1], &dst.full(), flags).unwrap();
    let src = alloc(&p.ctx[0], 200_000, 0);
    let pattern: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + 3) as u8).collect();
    let s = p.ctx[0].device().create_stream().unwrap();
    s.write_from_host(&src.full(), &pattern).unwrap();
    let src_reg = RegisteredMemory::register(&p.ctx[0], &src.full(), flags).unwrap();
    let remote = RegisteredMemory::from_bytes(&p.ctx[0], &dst_reg.to_bytes()).unwrap();

    let c = &p.conn[0];
    c.write(&remote, 1000, &src_reg, 50, 150_000).unwrap();
    c.update_and_sync(&remote, 300_000, 42).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while token(&dst, 300_000) != 42 {
        assert!(Instant::now() < deadline, "token never arrived over {t}");
        std::hint::spin_loop();
    }
    // The token is ordered after the data it guards.
    let got = read(&p.ctx[1], &dst);
    assert!(got[..1000].iter().all(|&b| b == 0xA5));
    assert_eq!(&got[1000..151_000], &pattern[50..150_050]);
    assert!(got[151_000..300_000].iter().all(|&b| b == 0xA5));
    c.flush(Duration::from_secs(10)).unwrap();

    // Bounds: both memories, naming offsets and sizes.
    let e = c
        .write(&remote, 300_000, &src_reg, 0, 9)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("offset 300000") && e.contains("length 9") && e.contains("300008 bytes"),
        "{e}"
    );
    let e = c
        .write(&remote, 0, &src_reg, 199_999, 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("source") && e.contains("200000 bytes"), "{e}");
    // Direction: the source must be local, the destination the peer's.
    assert!(c.write(&src_reg, 0, &src_reg, 0, 8).is_err());
    assert!(c.write(&remote, 0, &remote, 0, 8).is_err());
    assert!(c.update_and_sync(&remote, 3, 1).is_err());
    // A zero-length write is a no-op.
    c.write(&remote, 0, &src_reg, 0, 0).unwrap();
    c.flush(Duration::from_secs(10)).unwrap();
}

#[test]
fn cuda_ipc_write_update_flush() {
    write_update_flush(Transport::CudaIpc);
}

#[test]
fn ethernet_write_update_flush() {
    write_update_flush(Transport::Ethernet);
}

fn dropped_peer_fails_flush(t: Transport) {
    let p = pair(t);
    let Pair {
        ctx,
        conn: [c0, c1],
    } = p;
    let dst = alloc(&ctx[1], 4096, 0);
    let dst_reg = RegisteredMemory::register(&ctx[1], &dst.full(), t.into()).unwrap();
    let src = alloc(&ctx[0], 4096, 1);
    let src_reg = RegisteredMemory::register(&ctx[0], &src.full(), t.into()).unwrap();
    let remote = RegisteredMemory::from_bytes(&ctx[0], &dst_reg.to_bytes()).unwrap();
    c0.write(&remote, 0, &src_reg, 0, 4096).unwrap();
    c0.flush(Duration::from_secs(10)).unwrap();
    let dropped = Instant::now();
    drop(c1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        let r = c0
            .write(&remote, 0, &src_reg, 0, 4096)
            .and_then(|_| c0.flush(Duration::from_secs(10)));
        if let Err(e) = r {
            break e;
        }
        assert!(Instant::now() < deadline, "{t}: peer's drop never noticed");
    };
    assert!(matches!(err, Error::Remote { rank: 1, .. }), "{t}: {err}");
    assert!(err.to_string().contains("rank 1"), "{err}");
    // Every later operation fails at once, naming the peer.
    let again = c0.flush(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(again, Error::Remote { rank: 1, .. }), "{again}");
    eprintln!("{t}: peer's drop noticed after {:?}", dropped.elapsed());
}

#[test]
fn cuda_ipc_dropped_peer_fails_flush() {
    dropped_peer_fails_flush(Transport::CudaIpc);
}

#[test]
fn ethernet_dropped_peer_fails_flush() {
    dropped_peer_fails_flush(Transport::Ethernet);
}

#[test]
fn ethernet_write_into_deregistered_memory_fails_both_sides() {
    let p = pair(Transport::Ethernet);
    let dst = alloc(&p.ctx[1], 64, 0);
    let dst_reg =
        RegisteredMemory::register(&p.ctx[1], &dst.full(), Transport::Ethernet.into()).unwrap();
    let src = alloc(&p.ctx[0], 64, 1);
    let src_reg =
        RegisteredMemory::register(&p.ctx[0], &src.full(), Transport::Ethernet.into()).unwrap();
    let remote = RegisteredMemory::from_bytes(&p.ctx[0], &dst_reg.to_bytes()).unwrap();
    drop(dst_reg);
    p.conn[0].write(&remote, 0, &src_reg, 0, 64).unwrap();
    let e = p.conn[0].flush(Duration::from_secs(10)).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Remote { rank: 1, .. }), "{msg}");
    assert!(msg.contains("not registered for Ethernet"), "{msg}");
    let e1 = p.conn[1].flush(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(e1, Error::Remote { rank: 0, .. }), "{e1}");
}

#[test]
fn cuda_ipc_needs_a_mapped_destination() {
    let p = pair(Transport::CudaIpc);
    let dst = alloc(&p.ctx[1], 64, 0);
    let dst_reg =
        RegisteredMemory::register(&p.ctx[1], &dst.full(), Transport::Ethernet.into()).unwrap();
    let src = alloc(&p.ctx[0], 64, 1);
    let src_reg =
        RegisteredMemory::register(&p.ctx[0], &src.full(), Transport::CudaIpc.into()).unwrap();
    let remote = RegisteredMemory::from_bytes(&p.ctx[0], &dst_reg.to_bytes()).unwrap();
    let e = p.conn[0]
        .write(&remote, 0, &src_reg, 0, 8)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not mapped"), "{e}");
}

#[test]
fn stray_connection_is_refused_and_the_peer_still_connects() {
    use std::io::{Read, Write};
    let ctx = [host_ctx(0), host_ctx(1)];
    let l0 = Endpoint::new(&ctx[0], EndpointConfig::new(Transport::Ethernet)).unwrap();
    let l1 = Endpoint::new(&ctx[1], EndpointConfig::new(Transport::Ethernet)).unwrap();
    let (e0, e1) = (l0.endpoint().clone(), l1.endpoint().clone());
    let addr = e1.addr;
    let t1 = std::thread::spawn(move || connect(l1, &e0));
    // A stray speaks garbage first; it gets a refusal and rank 1 keeps waiting for rank 0.
    let mut stray = std::net::TcpStream::connect(addr).unwrap();
    stray
        .write_all(&[8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap();
    let mut answer = Vec::new();
    let _ = stray.read_to_end(&mut answer);
    assert!(String::from_utf8_lossy(&answer).contains("malformed"));
    let c0 = connect(l0, &e1).unwrap();
    let c1 = t1.join().unwrap().unwrap();
    assert_eq!((c0.remote_rank(), c1.remote_rank()), (1, 0));
}

#[test]
fn mismatched_transports_are_refused_naming_both_ranks() {
    let ctx = [host_ctx(0), host_ctx(1)];
    let l0 = Endpoint::new(&ctx[0], EndpointConfig::new(Transport::Ethernet)).unwrap();
    let l1 = Endpoint::new(&ctx[1], EndpointConfig::new(Transport::CudaIpc)).unwrap();
    let e = connect(l0, l1.endpoint()).unwrap_err().to_string();
    assert!(
        e.contains("rank 0 offered Ethernet") && e.contains("rank 1 offered CudaIpc"),
        "{e}"
    );
}
