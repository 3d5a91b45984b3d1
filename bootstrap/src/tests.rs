use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::collectives::{pack_blocks, tree_children, tree_parent, tree_size, unpack_blocks};
use super::config::{TIMEOUT_VAR, checked_timeout, secret_setting};
use super::protocol::*;
use super::reactor::conn::data_frame;
use super::state::Link;
use super::*;

pub(super) fn cfg(ms: u64) -> BootstrapConfig {
    BootstrapConfig {
        timeout: Duration::from_millis(ms),
        max_frame_bytes: 1 << 20,
        ..BootstrapConfig::default()
    }
}

pub(super) fn localhost0() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Runs `f(rank)` on `n` threads and returns their results in rank order.
pub(super) fn on_ranks<T: Send + 'static>(
    n: usize,
    f: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let f = Arc::clone(&f);
            thread::spawn(move || f(r))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn exercise(b: &Bootstrap) {
    let (r, n) = (b.rank(), b.nranks());
    // all_gather with a different length per rank.
    let got = b.all_gather(&vec![r as u8; r + 1]).unwrap();
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v, &vec![i as u8; i + 1]);
    }
    b.barrier().unwrap();
    let root = n - 1;
    let msg = if r == root {
        b"from the root".to_vec()
    } else {
        Vec::new()
    };
    assert_eq!(b.broadcast(root, &msg).unwrap(), b"from the root");
    // Several tags, both directions; received in the opposite tag order to the sending one.
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    for tag in [5u64, 6, 7] {
        for i in 0..3 {
            b.send(next, tag, format!("{r}->{next} t{tag} m{i}").as_bytes())
                .unwrap();
            b.send(prev, tag, format!("{r}->{prev} t{tag} m{i}").as_bytes())
                .unwrap();
        }
    }
    for tag in [7u64, 6, 5] {
        for i in 0..3 {
            let a = b.recv(prev, tag).unwrap();
            assert_eq!(a, format!("{prev}->{r} t{tag} m{i}").as_bytes());
            let c = b.recv(next, tag).unwrap();
            assert_eq!(c, format!("{next}->{r} t{tag} m{i}").as_bytes());
        }
    }
    // To ourselves.
    b.send(r, 1, b"self").unwrap();
    assert_eq!(b.recv(r, 1).unwrap(), b"self");
    b.barrier().unwrap();
}

#[test]
fn four_ranks_with_unique_id() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let hex = uid.to_string();
    on_ranks(4, move |r| {
        // Ranks other than the creator see the id as a child process would: parsed from hex.
        let id = if r == 0 {
            uid
        } else {
            UniqueId::from_str(&hex).unwrap()
        };
        let b = Bootstrap::new(&id, r, 4, cfg(10_000)).unwrap();
        assert_eq!((b.rank(), b.nranks(), b.local_rank()), (r, 4, None));
        exercise(&b);
    });
}

#[test]
fn root_in_a_non_rank_process() {
    let (root, uid) = BootstrapRoot::start(localhost0(), 3, &cfg(10_000)).unwrap();
    on_ranks(3, move |r| {
        exercise(&Bootstrap::new(&uid, r, 3, cfg(10_000)).unwrap())
    });
    root.wait().unwrap();
}

#[test]
fn two_ranks_from_addr() {
    let port = TcpListener::bind(localhost0())
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    on_ranks(2, move |r| {
        // The interface prefix form, with `lo` which every Linux host has.
        let addr = if r == 0 {
            format!("lo:127.0.0.1:{port}")
        } else {
            format!("127.0.0.1:{port}")
        };
        let b = Bootstrap::from_addr_with_secret(&addr, "test secret", r, 2, cfg(10_000), Some(r))
            .unwrap();
        assert_eq!(b.local_rank(), Some(r));
        exercise(&b);
    });
}

#[test]
fn from_addr_rejects_bad_specs() {
    let c = cfg(1000);
    let e = Bootstrap::from_addr("nosuchif0:127.0.0.1:5000", 1, 2, c.clone()).unwrap_err();
    assert!(e.to_string().contains("nosuchif0"), "{e}");
    let e = Bootstrap::from_addr("127.0.0.1:0", 0, 2, c.clone()).unwrap_err();
    assert!(e.to_string().contains("port 0"), "{e}");
    let e = Bootstrap::from_addr("127.0.0.1", 0, 2, c.clone()).unwrap_err();
    assert!(e.to_string().contains("port"), "{e}");
    let e = Bootstrap::from_addr("127.0.0.1:5000", 2, 2, c).unwrap_err();
    assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
}

#[test]
fn wrong_secret_is_refused_and_legit_ranks_complete() {
    let (root, uid) = BootstrapRoot::start(localhost0(), 2, &cfg(10_000)).unwrap();
    let intruder = UniqueId::from_parts(uid.root_addr(), [7u8; SECRET_BYTES]);
    let bad = thread::spawn(move || Bootstrap::new(&intruder, 0, 2, cfg(5_000)));
    let e = bad.join().unwrap().unwrap_err();
    assert!(e.to_string().contains("secret"), "{e}");
    assert!(matches!(e, Error::Remote { .. }), "{e:?}");
    on_ranks(2, move |r| {
        exercise(&Bootstrap::new(&uid, r, 2, cfg(10_000)).unwrap())
    });
    root.wait().unwrap();
}

#[test]
fn wrong_nranks_and_duplicate_ranks_are_refused() {
    let (root, uid) = BootstrapRoot::start(localhost0(), 2, &cfg(10_000)).unwrap();
    let e = Bootstrap::new(&uid, 0, 3, cfg(5_000)).unwrap_err();
    assert!(e.to_string().contains("nranks"), "{e}");
    // A raw Hello claiming rank 0 twice: the second one is refused.
    let hello = |rank| {
        let mut s = TcpStream::connect(uid.root_addr()).unwrap();
        let h = Hello {
            role: HelloRole::Root,
            secret: *uid.secret(),
            rank,
            nranks: 2,
            listen: localhost0(),
        };
        write_frame(&mut s, FrameKind::Hello, 0, &encode_hello(&h)).unwrap();
        s
    };
    // The root reads Hellos concurrently, so either connection may be the one it takes as the
    // duplicate: exactly one of them must get the refusal.
    let mut conns = [hello(0), hello(0)];
    for c in &conns {
        c.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let msg = 'found: loop {
        assert!(
            Instant::now() < deadline,
            "no connection was refused as a duplicate"
        );
        for c in &mut conns {
            if let Ok((h, p)) = read_frame(c, 4096) {
                assert_eq!(h.kind, FrameKind::Error);
                break 'found decode_error(&p).unwrap().1;
            }
        }
    };
    assert!(msg.contains("duplicate"), "{msg}");
    root.stop();
    assert!(root.wait().is_err());
}

#[test]
fn recv_times_out() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    on_ranks(2, move |r| {
        let b = Bootstrap::new(&uid, r, 2, cfg(500)).unwrap();
        let t = Instant::now();
        let e = b.recv(1 - r, 9).unwrap_err();
        let el = t.elapsed();
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        assert!(
            e.to_string().contains("rank(s) [") && e.to_string().contains("0x9"),
            "{e}"
        );
        assert!(e.to_string().contains(TIMEOUT_VAR), "{e}");
        assert!(
            el >= Duration::from_millis(450) && el < Duration::from_secs(3),
            "{el:?}"
        );
        // The bootstrap is still usable afterwards.
        b.barrier().unwrap();
    });
}

#[test]
fn root_times_out_waiting_for_a_missing_rank() {
    let (root, uid) = BootstrapRoot::start(localhost0(), 3, &cfg(500)).unwrap();
    let t = Instant::now();
    let errs = on_ranks(2, move |r| {
        Bootstrap::new(&uid, r, 3, cfg(500)).unwrap_err()
    });
    for e in errs {
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        // The deadline that passed is named by the variable that sets it.
        assert!(e.to_string().contains(TIMEOUT_VAR), "{e}");
    }
    let e = root.wait().unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(e.to_string().contains("[2]"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(3));

    // The same with the root parked in the creating rank.
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let e = Bootstrap::new(&uid, 0, 2, cfg(500)).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(e.to_string().contains("[1]"), "{e}");
}

#[test]
fn dead_peer_fails_the_barrier_promptly() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let deadline = Duration::from_secs(20);
    let results = on_ranks(4, move |r| {
        let b = Bootstrap::new(&uid, r, 4, cfg(deadline.as_millis() as u64)).unwrap();
        b.barrier().unwrap();
        if r == 1 {
            thread::sleep(Duration::from_millis(200));
            drop(b);
            return None;
        }
        let t = Instant::now();
        let e = b.barrier().unwrap_err();
        let el = t.elapsed();
        // Later operations with the dead peer fail at once too.
        let e2 = b.send(1, 0, b"x").unwrap_err();
        Some((e, e2, el))
    });
    for (e, e2, el) in results.into_iter().flatten() {
        assert!(matches!(e, Error::Remote { rank: 1, .. }), "{e:?}");
        assert!(e.to_string().contains("connection lost"), "{e}");
        assert!(matches!(e2, Error::Remote { rank: 1, .. }), "{e2:?}");
        assert!(el < Duration::from_secs(5), "{el:?}");
    }
}

#[test]
fn usage_errors() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let b = Bootstrap::new(&uid, 0, 1, cfg(1000)).unwrap();
    assert!(matches!(
        b.send(0, RESERVED_TAG_BIT | 3, b""),
        Err(Error::InvalidUsage(_))
    ));
    assert!(matches!(b.recv(0, u64::MAX), Err(Error::InvalidUsage(_))));
    assert!(matches!(b.send(1, 0, b""), Err(Error::InvalidUsage(_))));
    assert!(matches!(b.broadcast(5, b""), Err(Error::InvalidUsage(_))));
    assert!(matches!(
        b.send(0, 0, &vec![0; (1 << 20) + 1]),
        Err(Error::InvalidUsage(_))
    ));
    assert_eq!(b.all_gather(b"solo").unwrap(), vec![b"solo".to_vec()]);
    assert!(matches!(
        Bootstrap::new(&uid, 1, 1, cfg(100)),
        Err(Error::InvalidUsage(_))
    ));
    assert!(matches!(
        Bootstrap::new(&uid, 0, 0, cfg(100)),
        Err(Error::InvalidUsage(_))
    ));
}

#[test]
fn unique_id_round_trips_and_rejects_bad_input() {
    for addr in ["10.1.2.3:4567", "[fe80::1:2]:80"] {
        let id = UniqueId::from_parts(addr.parse().unwrap(), [0xab; SECRET_BYTES]);
        let bytes = id.to_bytes();
        assert_eq!(bytes.len(), UNIQUE_ID_BYTES);
        assert_eq!(UniqueId::from_bytes(&bytes).unwrap(), id);
        let hex = id.to_string();
        assert_eq!(hex.len(), 256);
        assert_eq!(UniqueId::from_str(&hex).unwrap(), id);
        assert!(!format!("{id:?}").contains("abab"));

        let mut bad = bytes;
        bad[0] ^= 1;
        assert!(
            UniqueId::from_bytes(&bad)
                .unwrap_err()
                .to_string()
                .contains("magic")
        );
        let mut bad = bytes;
        bad[4] = 9;
        assert!(
            UniqueId::from_bytes(&bad)
                .unwrap_err()
                .to_string()
                .contains("version")
        );
        let mut bad = bytes;
        bad[127] = 1;
        assert!(
            UniqueId::from_bytes(&bad)
                .unwrap_err()
                .to_string()
                .contains("padding")
        );
        assert!(UniqueId::from_bytes(&bytes[..127]).is_err());
        assert!(UniqueId::from_str(&hex[..254]).is_err());
        assert!(UniqueId::from_str(&format!("zz{}", &hex[2..])).is_err());
    }
}

#[test]
fn oversized_frame_is_rejected_before_allocating() {
    for len in [(1u64 << 30) + 1, 1 << 40, u64::MAX] {
        let h = encode_frame_header(&FrameHeader {
            kind: FrameKind::Data,
            tag: 1,
            len,
        });
        // Only the header is present: were the payload allocated and read, this would either
        // abort on allocation or fail with UnexpectedEof instead.
        let e = read_frame(&mut std::io::Cursor::new(h.to_vec()), 1 << 30).unwrap_err();
        let e = from_io(e, "test");
        assert!(matches!(e, Error::Malformed { .. }), "{e:?}");
        assert!(e.to_string().contains("limit is 1073741824"), "{e}");
    }
}

/// Connects, sends `bytes`, and returns the Error frame's message the listener answers with
/// (or `None` if it just closed the connection).
fn poke(addr: SocketAddr, bytes: &[u8]) -> Option<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    match read_frame(&mut s, 4096) {
        Ok((h, p)) if h.kind == FrameKind::Error => decode_error(&p).ok().map(|(_, m)| m),
        _ => None,
    }
}

#[test]
fn garbage_to_the_root_is_refused() {
    let (root, uid) = BootstrapRoot::start(localhost0(), 2, &cfg(10_000)).unwrap();
    let a = uid.root_addr();
    let m = poke(a, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(m.contains("refused"), "{m}");
    let huge = encode_frame_header(&FrameHeader {
        kind: FrameKind::Hello,
        tag: 0,
        len: 1 << 30,
    });
    let m = poke(a, &huge).unwrap();
    assert!(m.contains("limit"), "{m}");
    let data = encode_frame_header(&FrameHeader {
        kind: FrameKind::Data,
        tag: 0,
        len: 0,
    });
    assert!(poke(a, &data).unwrap().contains("Hello"));
    // A client that connects and says nothing holds up no one.
    let _silent = TcpStream::connect(a).unwrap();
    on_ranks(2, move |r| {
        exercise(&Bootstrap::new(&uid, r, 2, cfg(10_000)).unwrap())
    });
    root.wait().unwrap();
}

#[test]
fn garbage_to_a_rank_listener_is_refused() {
    // Ranks listen for the whole life of the bootstrap (connections open on first use), so a
    // rank's listener is poked while three real ranks wait to exchange messages.
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = std::sync::Mutex::new(go_rx);
    let tx = std::sync::Mutex::new(tx);
    let ranks = thread::spawn(move || {
        let go_rx = Arc::new(go_rx);
        let tx = Arc::new(tx);
        on_ranks(3, move |r| {
            let b = Bootstrap::new(&uid, r, 3, cfg(10_000)).unwrap();
            if r == 2 {
                tx.lock().unwrap().send(b.listen_addr()).unwrap();
                go_rx.lock().unwrap().recv().unwrap();
            }
            b.barrier().unwrap();
            let other = (r + 1) % 3;
            b.send(other, 4, &[r as u8]).unwrap();
            let from = (r + 2) % 3;
            assert_eq!(b.recv(from, 4).unwrap(), vec![from as u8]);
        })
    });
    let rank2 = rx.recv().unwrap();
    let m = poke(rank2, &[0xff; 300]).unwrap();
    assert!(m.contains("rank 2") && m.contains("magic"), "{m}");
    let mut hello = Hello {
        role: HelloRole::Peer,
        secret: [0; SECRET_BYTES],
        rank: 0,
        nranks: 3,
        listen: localhost0(),
    };
    let mut frame = Vec::new();
    write_frame(&mut frame, FrameKind::Hello, 0, &encode_hello(&hello)).unwrap();
    assert!(poke(rank2, &frame).unwrap().contains("secret"));
    hello.secret = *uid.secret();
    hello.rank = 2;
    let mut frame = Vec::new();
    write_frame(&mut frame, FrameKind::Hello, 0, &encode_hello(&hello)).unwrap();
    assert!(poke(rank2, &frame).unwrap().contains("not expected"));
    hello.nranks = 4;
    hello.rank = 1;
    let mut frame = Vec::new();
    write_frame(&mut frame, FrameKind::Hello, 0, &encode_hello(&hello)).unwrap();
    assert!(poke(rank2, &frame).unwrap().contains("nranks"));
    go_tx.send(()).unwrap();
    ranks.join().unwrap();
}

#[test]
fn frame_and_hello_round_trip() {
    let h = FrameHeader {
        kind: FrameKind::Data,
        tag: 0xdead_beef,
        len: 77,
    };
    assert_eq!(decode_frame_header(&encode_frame_header(&h)).unwrap(), h);
    let hello = Hello {
        role: HelloRole::Root,
        secret: [3; SECRET_BYTES],
        rank: 5,
        nranks: 9,
        listen: "[::1]:1234".parse().unwrap(),
    };
    assert_eq!(decode_hello(&encode_hello(&hello)).unwrap(), hello);
    let t = vec![localhost0(), "[::1]:9".parse().unwrap()];
    assert_eq!(decode_table(&encode_table(&t), 2).unwrap(), t);
    assert!(decode_table(&encode_table(&t), 3).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn frame_header_decode_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..48)) {
        let _ = decode_frame_header(&buf);
        let _ = read_frame(&mut std::io::Cursor::new(buf), 64);
    }

    #[test]
    fn mutated_frame_header_never_panics(i in 0usize..FRAME_HEADER_BYTES, b in any::<u8>(), len in any::<u64>()) {
        let mut h = encode_frame_header(&FrameHeader { kind: FrameKind::Data, tag: 1, len });
        h[i] = b;
        if let Ok(d) = decode_frame_header(&h) {
            let _ = check_payload_len(&d, 1 << 30);
        }
    }

    #[test]
    fn hello_decode_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..96)) {
        let _ = decode_hello(&buf);
        let _ = decode_error(&buf);
        let _ = decode_table(&buf, 2);
    }

    #[test]
    fn mutated_hello_never_panics(i in 0usize..64, b in any::<u8>(), cut in 0usize..64) {
        let mut v = encode_hello(&Hello {
            role: HelloRole::Peer,
            secret: [1; SECRET_BYTES],
            rank: 1,
            nranks: 2,
            listen: localhost0(),
        });
        if i < v.len() { v[i] = b; }
        v.truncate(cut);
        let _ = decode_hello(&v);
    }

    #[test]
    fn unique_id_decode_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..160)) {
        let _ = UniqueId::from_bytes(&buf);
    }

    #[test]
    fn mutated_unique_id_never_panics(i in 0usize..UNIQUE_ID_BYTES, b in any::<u8>(), s in "\\PC{0,300}") {
        let mut v = UniqueId::from_parts(localhost0(), [9; SECRET_BYTES]).to_bytes();
        v[i] = b;
        let _ = UniqueId::from_bytes(&v);
        let _ = UniqueId::from_str(&s);
    }
}

#[test]
fn bootstrap_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Bootstrap>();
    check::<BootstrapRoot>();
    check::<UniqueId>();
}

/// Runs the accept loop for one rank (rank 0 of 1, secret `[7; 16]`) on a thread, with a short
/// hello limit; returns the listener's address and the loop's thread.
type Accepted1 = (Option<(TcpStream, Hello)>, Option<Error>);

fn accept_one(hello_limit: Duration) -> (SocketAddr, thread::JoinHandle<Accepted1>) {
    let listener = TcpListener::bind(localhost0()).unwrap();
    let addr = listener.local_addr().unwrap();
    let t = thread::spawn(move || {
        let secret = [7u8; SECRET_BYTES];
        let expect = root::Expect {
            role: HelloRole::Root,
            secret: &secret,
            nranks: 1,
            ranks: 0..1,
            who: "the test root".into(),
            hello_limit,
        };
        let stop = std::sync::atomic::AtomicBool::new(false);
        let timeout = Duration::from_secs(20);
        let acc = root::accept_ranks(&listener, &expect, Instant::now() + timeout, timeout, &stop);
        (acc.conns.into_iter().next().flatten(), acc.error)
    });
    (addr, t)
}

fn hello_frame(rank: usize, nranks: usize) -> Vec<u8> {
    let hello = Hello {
        role: HelloRole::Root,
        secret: [7; SECRET_BYTES],
        rank,
        nranks,
        listen: localhost0(),
    };
    let mut frame = Vec::new();
    write_frame(&mut frame, FrameKind::Hello, 0, &encode_hello(&hello)).unwrap();
    frame
}

/// A client that sends its hello a byte at a time, each byte well within any per-read limit,
/// is cut off when the handshake's total limit passes, and told so in plain words.
#[test]
fn slow_loris_hello_is_cut_at_its_total_deadline() {
    let limit = Duration::from_millis(300);
    let (addr, acceptor) = accept_one(limit);
    let t = Instant::now();
    let mut loris = TcpStream::connect(addr).unwrap();
    let mut w = loris.try_clone().unwrap();
    let frame = hello_frame(0, 1);
    let trickle = thread::spawn(move || {
        // Everything but the last byte, one every 50 ms (about 2 s in all).
        for b in &frame[..frame.len() - 1] {
            if w.write_all(&[*b]).is_err() {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
    });
    loris
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let (h, p) = read_frame(&mut loris, 4096).unwrap();
    let cut = t.elapsed();
    assert_eq!(h.kind, FrameKind::Error);
    let (code, msg) = decode_error(&p).unwrap();
    assert_eq!(code, ErrorCode::Timeout, "{msg}");
    assert!(
        msg.contains("a complete hello from")
            && msg.contains("300ms")
            && msg.contains("bytes")
            && !msg.contains("os error"),
        "{msg}"
    );
    assert!(cut >= limit && cut < Duration::from_millis(1500), "{cut:?}");
    // The legitimate rank still gets in.
    let mut rank0 = TcpStream::connect(addr).unwrap();
    rank0.write_all(&hello_frame(0, 1)).unwrap();
    let (conn, err) = acceptor.join().unwrap();
    assert!(err.is_none(), "{err:?}");
    assert_eq!(conn.unwrap().1.rank, 0);
    drop(loris);
    let _ = trickle.join();
}

/// Beyond the bound on open handshakes the oldest silent connections are closed at once, without a
/// thread each, and the legitimate rank is accepted while the others are pending.
#[test]
fn flood_of_silent_connections_is_bounded() {
    let (addr, acceptor) = accept_one(Duration::from_secs(8));
    let extra = 40;
    let total = super::hello::MAX_PENDING_HELLOS + extra;
    let mut flood: Vec<TcpStream> = (0..total)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let closed = |s: &mut TcpStream| {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            _ => true,
        }
    };
    let t = Instant::now();
    let mut n_closed = 0;
    while t.elapsed() < Duration::from_secs(5) {
        n_closed = 0;
        for s in flood.iter_mut() {
            n_closed += usize::from(closed(s));
        }
        if n_closed >= extra {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(n_closed, extra, "closed within {:?}", t.elapsed());
    let t = Instant::now();
    let mut rank0 = TcpStream::connect(addr).unwrap();
    rank0.write_all(&hello_frame(0, 1)).unwrap();
    let (conn, err) = acceptor.join().unwrap();
    assert!(err.is_none(), "{err:?}");
    assert_eq!(conn.unwrap().1.rank, 0);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // The pending ones stayed open until the loop ended (it closes them when it returns).
    assert!(flood.len() == total);
}

#[test]
fn truncated_frames_say_how_far_they_got() {
    let mut frame = Vec::new();
    write_frame(&mut frame, FrameKind::Data, 9, &[1u8; 17]).unwrap();
    let cut = &frame[..FRAME_HEADER_BYTES + 5];
    let e = read_frame(&mut std::io::Cursor::new(cut.to_vec()), 1 << 20).unwrap_err();
    assert_eq!(
        describe_read_error(&e),
        "closed the connection after 28 of 40 bytes of a Data frame"
    );
    let e = read_frame(&mut std::io::Cursor::new(frame[..5].to_vec()), 1 << 20).unwrap_err();
    assert_eq!(
        describe_read_error(&e),
        "closed the connection after 5 of the 23 bytes of a frame header"
    );
    let e = read_frame(&mut std::io::Cursor::new(Vec::new()), 1 << 20).unwrap_err();
    assert_eq!(describe_read_error(&e), "closed the connection");
}

/// A peer whose connection ends in the middle of a frame: the error names its rank, its
/// address and how much of the frame arrived.
#[test]
fn peer_dying_mid_frame_is_named() {
    // The test plays the root and rank 1 of 2; rank 0 is a real bootstrap.
    let root = TcpListener::bind(localhost0()).unwrap();
    let secret = [9u8; SECRET_BYTES];
    let uid = UniqueId::from_parts(root.local_addr().unwrap(), secret);
    // Rank 0's init (its all-gather of host identities) is what meets the cut frame.
    let rank0 = thread::spawn(move || Bootstrap::new(&uid, 0, 2, cfg(10_000)).unwrap_err());
    let (mut to0, _) = root.accept().unwrap();
    let (_, p) = read_frame(&mut to0, HANDSHAKE_MAX_BYTES).unwrap();
    let hello0 = decode_hello(&p).unwrap();
    let me = TcpListener::bind(localhost0()).unwrap();
    let table = encode_table(&[hello0.listen, me.local_addr().unwrap()]);
    write_frame(&mut to0, FrameKind::Table, 0, &table).unwrap();
    let (mut mesh, _) = me.accept().unwrap();
    let (h, _) = read_frame(&mut mesh, HANDSHAKE_MAX_BYTES).unwrap();
    assert_eq!(h.kind, FrameKind::Hello);
    write_frame(&mut mesh, FrameKind::Ack, 0, &[]).unwrap();
    let mut frame = Vec::new();
    write_frame(&mut frame, FrameKind::Data, 7, &[1u8; 17]).unwrap();
    mesh.write_all(&frame[..FRAME_HEADER_BYTES + 5]).unwrap();
    let addr = mesh.local_addr().unwrap();
    drop(mesh);
    let e = rank0.join().unwrap();
    assert!(matches!(e, Error::Remote { rank: 1, .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains(&format!(
            "{addr} closed the connection after 28 of 40 bytes of a Data frame"
        )) && m.starts_with("rank 1:"),
        "{m}"
    );
}

/// 64 ranks as threads: every collective is right, for both schedules, and a rank holds no
/// more connections than its schedule's peers (2 ceil(log2 N) for `Log`, 2 for `Ring`).
#[test]
fn sixty_four_ranks_use_logarithmic_connections() {
    for schedule in [Schedule::Log, Schedule::Ring] {
        const N: usize = 64;
        let uid = UniqueId::with_root(localhost0()).unwrap();
        let links = on_ranks(N, move |r| {
            let c = BootstrapConfig {
                schedule,
                ..cfg(30_000)
            };
            let b = Bootstrap::new(&uid, r, N, c).unwrap();
            assert_eq!(b.hosts().len(), N);
            assert_eq!(b.host_peers().len(), N, "one host here");
            assert_eq!(b.host_rank(), r);
            b.barrier().unwrap();
            let all = b.all_gather(&vec![r as u8; r % 7]).unwrap();
            for (i, v) in all.iter().enumerate() {
                assert_eq!(v, &vec![i as u8; i % 7]);
            }
            // Bruck's all-gather, which ranks take when they do not outnumber the cores.
            if schedule == Schedule::Log {
                let tag = b.next_coll_tag(1);
                let all = b.bruck_all_gather(&[r as u8, 1], tag).unwrap();
                for (i, v) in all.iter().enumerate() {
                    assert_eq!(v, &vec![i as u8, 1]);
                }
            }
            for root in [0, 5, N - 1] {
                let got = b.broadcast(root, &[root as u8, 9]).unwrap();
                assert_eq!(got, vec![root as u8, 9]);
            }
            b.link_stats()
        });
        let limit = schedule_peers(schedule, 0, N).len();
        for (r, s) in links.iter().enumerate() {
            assert!(
                s.open <= limit,
                "{schedule:?}: rank {r} holds {s:?}, limit {limit}"
            );
        }
    }
}

#[test]
fn binomial_tree_covers_every_rank_once() {
    for n in [1usize, 2, 3, 7, 8, 13, 64, 100] {
        let mut seen = vec![0usize; n];
        seen[0] = 1;
        for v in 0..n {
            for c in tree_children(v, n) {
                assert_eq!(tree_parent(c), v);
                seen[c] += 1;
            }
            // A subtree is its root and its children's subtrees, contiguous.
            let sub: usize = 1 + tree_children(v, n)
                .iter()
                .map(|&c| tree_size(c, n))
                .sum::<usize>();
            assert_eq!(sub, tree_size(v, n), "n {n} v {v}");
        }
        assert!(seen.iter().all(|&k| k == 1), "n {n}: {seen:?}");
        let peers = schedule_peers(Schedule::Log, 5 % n, n);
        for c in tree_children(5 % n, n) {
            assert!(peers.contains(&c));
        }
    }
}

#[test]
fn schedule_peers_are_logarithmic() {
    assert_eq!(schedule_peers(Schedule::Log, 0, 1), Vec::<usize>::new());
    assert_eq!(schedule_peers(Schedule::Log, 0, 2), vec![1]);
    assert_eq!(schedule_peers(Schedule::Log, 3, 8), vec![1, 2, 4, 5, 7]);
    assert_eq!(schedule_peers(Schedule::Log, 0, 1024).len(), 19);
    assert_eq!(schedule_peers(Schedule::Ring, 0, 4096), vec![1, 4095]);
    assert!("tree".parse::<Schedule>().is_err());
}

/// Split and shrink make views over the parent's connections: no new root, no new listener.
#[test]
fn split_and_shrink_reuse_the_parent() {
    const N: usize = 12;
    let uid = UniqueId::with_root(localhost0()).unwrap();
    on_ranks(N, move |r| {
        let b = Bootstrap::new(&uid, r, N, cfg(20_000)).unwrap();
        b.barrier().unwrap();
        let listen = b.listen_addr();
        // Colors by parity, reversed order by key; rank 11 joins no view.
        let color = (r != 11).then_some((r % 2) as u32);
        let child = b.split(color, (N - r) as u32).unwrap();
        if r == 11 {
            assert!(child.is_none());
        } else {
            let c = child.unwrap();
            let members: Vec<usize> = (0..N - 1).rev().filter(|x| x % 2 == r % 2).collect();
            assert_eq!(c.nranks(), members.len());
            assert_eq!(members[c.rank()], r);
            assert_eq!(c.listen_addr(), listen, "a view has no listener of its own");
            let all = c.all_gather(&[r as u8]).unwrap();
            let want: Vec<Vec<u8>> = members.iter().map(|&m| vec![m as u8]).collect();
            assert_eq!(all, want);
            c.barrier().unwrap();
            let next = (c.rank() + 1) % c.nranks();
            c.send(next, 3, b"child").unwrap();
            let prev = (c.rank() + c.nranks() - 1) % c.nranks();
            assert_eq!(c.recv(prev, 3).unwrap(), b"child");
        }
        // The parent still works, its messages apart from the views'.
        let all = b.all_gather(&[r as u8]).unwrap();
        assert_eq!(all.len(), N);
        let s = b.shrink(&[0, 7]).unwrap();
        if r == 0 || r == 7 {
            assert!(s.is_none());
            return;
        }
        let s = s.unwrap();
        assert_eq!(s.nranks(), N - 2);
        let got = s.broadcast(0, &[42]).unwrap();
        assert_eq!(got, vec![42]);
        s.barrier().unwrap();
    });
}

/// NCCL's excluded ranks do not call `ncclCommShrink`: a shrink by the others must not put
/// them out of step, so a later split over every rank still meets (it used to wait for a view
/// id the excluded rank never made, until the deadline); two shrinks of the same set are two
/// views.
#[test]
fn a_shrink_the_excluded_rank_skips_leaves_later_splits_in_step() {
    const N: usize = 3;
    let uid = UniqueId::with_root(localhost0()).unwrap();
    on_ranks(N, move |r| {
        let b = Bootstrap::new(&uid, r, N, cfg(10_000)).unwrap();
        if r != 2 {
            let first = b.shrink(&[2]).unwrap().unwrap();
            let second = b.shrink(&[2]).unwrap().unwrap();
            first.send(1 - first.rank(), 5, b"first").unwrap();
            second.send(1 - second.rank(), 5, b"second").unwrap();
            assert_eq!(second.recv(1 - second.rank(), 5).unwrap(), b"second");
            assert_eq!(first.recv(1 - first.rank(), 5).unwrap(), b"first");
        }
        let all = b.split(Some(0), r as u32).unwrap().unwrap();
        assert_eq!(
            all.all_gather(&[r as u8]).unwrap(),
            vec![vec![0], vec![1], vec![2]]
        );
    });
}

#[test]
fn all_gather_blocks_are_validated() {
    let blocks = vec![vec![1u8, 2], vec![], vec![3]];
    let packed = pack_blocks(&blocks);
    assert_eq!(unpack_blocks(&packed, 3, 1).unwrap(), blocks);
    assert!(
        unpack_blocks(&packed, 2, 1)
            .unwrap_err()
            .to_string()
            .contains("rank 1")
    );
    for cut in 0..packed.len() {
        assert!(unpack_blocks(&packed[..cut], 3, 1).is_err());
    }
    let mut huge = packed.clone();
    huge[4..12].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(unpack_blocks(&huge, 3, 1).is_err());
}

impl Bootstrap {
    /// Ends every connection without a goodbye, as a crash would (the process stays).
    pub(super) fn sever(&self) {
        let sh = self.shared();
        let st = sh.lock();
        sh.closing.store(true, Ordering::Release);
        for l in st.links.values() {
            if let Link::Up(c) = l {
                c.shutdown();
            }
        }
    }
}

#[test]
fn a_crash_reaches_every_rank_without_an_operation() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    // Rank 4 may leave the bootstrap barrier while others are still in it (they wait for
    // messages relayed after its own arrived): it severs only once every rank is out.
    let all_out = Arc::new(std::sync::Barrier::new(6));
    let results = on_ranks(6, move |r| {
        let b = Bootstrap::new(&uid, r, 6, cfg(20_000)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        b.on_failure(Box::new(move |f| {
            let _ = tx.lock().unwrap().send(f.clone());
        }));
        b.barrier().unwrap();
        all_out.wait();
        if r == 4 {
            b.sever();
            // Keep the view alive (no goodbye) until the others have seen it.
            thread::sleep(Duration::from_millis(1500));
            return None;
        }
        // No operation: the readers alone must learn it.
        let f = rx.recv_timeout(Duration::from_secs(5)).ok();
        Some((r, f, b.failure()))
    });
    for (r, f, failure) in results.into_iter().flatten() {
        let f = f.unwrap_or_else(|| panic!("rank {r} was not told"));
        assert_eq!(f.rank, 4, "rank {r}: {f}");
        assert_eq!(failure.map(|x| x.rank), Some(4), "rank {r}");
        assert!(f.at.elapsed() < Duration::from_secs(5));
    }
}

#[test]
fn an_orderly_close_is_not_a_failure() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let results = on_ranks(4, move |r| {
        let b = Bootstrap::new(&uid, r, 4, cfg(20_000)).unwrap();
        b.barrier().unwrap();
        if r == 2 {
            drop(b);
            return None;
        }
        thread::sleep(Duration::from_millis(300));
        Some((r, b.failure()))
    });
    for (r, failure) in results.into_iter().flatten() {
        assert!(failure.is_none(), "rank {r}: {failure:?}");
    }
}

/// The event loop is one thread per process, whatever the number of ranks and connections:
/// 24 ranks as threads of a child process (this test run again, alone) hold the rank threads,
/// the main thread, the loop and at most the root's.
#[test]
fn threads_do_not_grow_with_ranks_or_connections() {
    const N: usize = 24;
    if std::env::var_os("MSCCLPP_BOOT_THREADS_CHILD").is_some() {
        let uid = UniqueId::with_root(localhost0()).unwrap();
        let counts = on_ranks(N, move |r| {
            let b = Bootstrap::new(&uid, r, N, cfg(30_000)).unwrap();
            b.barrier().unwrap();
            // Every rank sends to every other: N - 1 connections each.
            for p in (0..N).filter(|&p| p != r) {
                b.send(p, 3, &[r as u8]).unwrap();
            }
            for p in (0..N).filter(|&p| p != r) {
                assert_eq!(b.recv(p, 3).unwrap(), vec![p as u8]);
            }
            b.barrier().unwrap();
            let threads = std::fs::read_to_string("/proc/self/status")
                .unwrap()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("Threads:")
                        .map(|v| v.trim().parse::<usize>())
                })
                .unwrap()
                .unwrap();
            let links = b.link_stats().open;
            b.barrier().unwrap();
            (threads, links)
        });
        let (threads, links) = counts[0];
        println!("THREADS {threads} LINKS {links}");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests::threads_do_not_grow_with_ranks_or_connections",
            "--nocapture",
        ])
        .env("MSCCLPP_BOOT_THREADS_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("THREADS"))
        .unwrap_or_else(|| panic!("no figures in {text}"));
    let f: Vec<usize> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (threads, links) = (f[0], f[1]);
    assert_eq!(links, N - 1, "{line}");
    // N ranks + the test harness's main and test threads + the loop (+ the root, ending).
    assert!(threads <= N + 4, "{threads} threads for {N} ranks: {line}");
}

/// Two ranks each send the other 24 MiB before either receives: the sends are queued (the
/// kernel's buffers hold far less), not blocked on a peer that is itself sending.
#[test]
fn large_messages_both_ways_at_once() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    on_ranks(2, move |r| {
        let c = BootstrapConfig {
            max_frame_bytes: 32 << 20,
            ..cfg(30_000)
        };
        let b = Bootstrap::new(&uid, r, 2, c).unwrap();
        let mine: Vec<u8> = (0..24usize << 20).map(|i| (i * 7 + r) as u8).collect();
        let t = Instant::now();
        b.send(1 - r, 9, &mine).unwrap();
        b.send(1 - r, 9, b"after").unwrap();
        let got = b.recv(1 - r, 9).unwrap();
        assert_eq!(got.len(), 24 << 20);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &x)| x == (i * 7 + 1 - r) as u8)
        );
        assert_eq!(b.recv(1 - r, 9).unwrap(), b"after");
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
        b.barrier().unwrap();
    });
}

/// Messages under one tag arrive in the order sent, whether the event loop or the waiting
/// thread read them: the receiver takes them in bursts with pauses in between.
#[test]
fn one_tags_messages_keep_their_order() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    on_ranks(2, move |r| {
        let b = Bootstrap::new(&uid, r, 2, cfg(30_000)).unwrap();
        const M: u32 = 2000;
        if r == 0 {
            for i in 0..M {
                b.send(1, 4, &i.to_le_bytes()).unwrap();
                if i % 300 == 0 {
                    thread::sleep(Duration::from_millis(5));
                }
            }
        } else {
            for i in 0..M {
                if i % 250 == 0 {
                    thread::sleep(Duration::from_millis(7));
                }
                assert_eq!(b.recv(0, 4).unwrap(), i.to_le_bytes(), "message {i}");
            }
        }
        b.barrier().unwrap();
    });
}

/// A rank waiting on a live peer that never sends fails as soon as another rank of the job
/// dies, naming it, though the death ends a connection the waiting thread is not reading.
#[test]
fn a_waiting_rank_hears_of_a_death_elsewhere() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let results = on_ranks(4, move |r| {
        let b = Bootstrap::new(&uid, r, 4, cfg(20_000)).unwrap();
        b.barrier().unwrap();
        match r {
            0 => {
                let t = Instant::now();
                let e = b.recv(1, 11).unwrap_err();
                Some((e, t.elapsed()))
            }
            2 => {
                thread::sleep(Duration::from_millis(300));
                b.sever();
                thread::sleep(Duration::from_millis(3000));
                None
            }
            _ => {
                thread::sleep(Duration::from_millis(3300));
                None
            }
        }
    });
    let (e, took) = results.into_iter().flatten().next().unwrap();
    assert!(matches!(e, Error::Remote { rank: 2, .. }), "{e}");
    assert!(took < Duration::from_secs(3), "{took:?}: {e}");
}

/// Data frames are the bytes `decode_data` and `read_frame` expect.
#[test]
fn data_frames_round_trip() {
    let f = data_frame(0x0102_0304_0506_0708, 77, b"payload");
    let (h, p) = read_frame(&mut std::io::Cursor::new(f), 1 << 10).unwrap();
    assert_eq!((h.kind, h.tag), (FrameKind::Data, 77));
    assert_eq!(
        decode_data(p).unwrap(),
        (0x0102_0304_0506_0708, b"payload".to_vec())
    );
}

// The stale-id tests use rank counts no other test of this binary uses (5, 7, 9): a root of
// the same size started by a test running beside them would be taken for the successor.

/// A unique id whose rendezvous is over (what a rank reads from a store that outlived the
/// communicator, after PyTorch's destroy_process_group and re-init), with no communicator
/// started in its place: refused naming why once the root's wait for a successor is over (its
/// bootstrap deadline), not dialled until the caller's.
#[test]
fn a_stale_unique_id_without_a_successor_is_refused_naming_why() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let (u2, u3) = (uid, uid);
    let done = on_ranks(5, move |r| {
        Bootstrap::new(&u2, r, 5, cfg(2_000)).map(|b| b.barrier())
    });
    assert!(done.iter().all(|d| matches!(d, Ok(Ok(())))));
    let t = Instant::now();
    let e = Bootstrap::new(&u3, 1, 5, cfg(20_000)).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "took {:?} to refuse a stale id",
        t.elapsed()
    );
    let m = e.to_string();
    assert!(
        m.contains("rendezvous is over") && m.contains("no communicator of 5 ranks"),
        "{m}"
    );
}

/// Re-initialisation as PyTorch does it under torchrun: the communicator is destroyed, rank 0
/// makes a new id, and a rank reads the old one from the store (before rank 0 wrote the new
/// one). That rank dials the old root, is sent to the new one, and the ranks form one
/// communicator again; also when the stale rank dials before rank 0 has made the new id.
#[test]
fn a_stale_unique_id_joins_the_rendezvous_that_replaced_it() {
    const N: usize = 7;
    for stale_first in [false, true] {
        let old = UniqueId::with_root(localhost0()).unwrap();
        let done = on_ranks(N, move |r| {
            Bootstrap::new(&old, r, N, cfg(10_000)).map(|b| b.barrier())
        });
        assert!(done.iter().all(|d| matches!(d, Ok(Ok(())))));
        let (tx, rx) = std::sync::mpsc::channel::<UniqueId>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let txs = Arc::new(std::sync::Mutex::new(tx));
        let got = on_ranks(N, move |r| -> Result<Vec<Vec<u8>>> {
            let id = if r == 0 {
                if stale_first {
                    thread::sleep(Duration::from_millis(300));
                }
                let id = UniqueId::with_root(localhost0())?;
                for _ in 1..N - 1 {
                    txs.lock().unwrap().send(id).unwrap();
                }
                id
            } else if r == 1 {
                old // read from the store before rank 0 wrote the new id
            } else {
                rx.lock().unwrap().recv().unwrap()
            };
            let b = Bootstrap::new(&id, r, N, cfg(10_000))?;
            let all = b.all_gather(&[r as u8])?;
            b.barrier()?;
            Ok(all)
        });
        for (r, g) in got.into_iter().enumerate() {
            let all = g.unwrap_or_else(|e| panic!("rank {r} (stale first: {stale_first}): {e}"));
            assert_eq!(
                all,
                (0..N as u8).map(|i| vec![i]).collect::<Vec<_>>(),
                "rank {r}"
            );
        }
    }
}

/// A stale id while its communicator still lives in the root's process is refused, not sent
/// anywhere: no re-initialisation is going on.
#[test]
fn a_stale_unique_id_of_a_live_communicator_is_refused() {
    const N: usize = 9;
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let hold = thread::spawn(move || {
        let b = Bootstrap::new(&uid, 0, N, cfg(2_000)).unwrap();
        rx.recv().unwrap();
        drop(b);
    });
    let others = on_ranks(N - 1, move |r| Bootstrap::new(&uid, r + 1, N, cfg(2_000)));
    assert!(others.iter().all(Result::is_ok));
    let e = Bootstrap::new(&uid, 1, N, cfg(20_000)).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("still lives"), "{m}");
    tx.send(()).unwrap();
    hold.join().unwrap();
    drop(others);
}

#[test]
fn timeouts_below_a_millisecond_are_refused_naming_the_variable() {
    let e = checked_timeout(Some(Duration::from_secs_f64(0.000001))).unwrap_err();
    let m = e.to_string();
    assert!(m.contains(TIMEOUT_VAR) && m.contains("0.001"), "{m}");
    assert_eq!(
        checked_timeout(Some(Duration::from_millis(1))).unwrap(),
        Some(Duration::from_millis(1))
    );
    assert_eq!(checked_timeout(None).unwrap(), None);
}

#[test]
fn an_empty_bootstrap_secret_is_refused() {
    for blank in ["", "  "] {
        let e = secret_setting(Some(blank)).unwrap_err().to_string();
        assert!(
            e.contains("MSCCLPP_BOOTSTRAP_SECRET") && e.contains("empty"),
            "{e}"
        );
    }
    assert_eq!(secret_setting(None).unwrap(), None);
    assert_eq!(secret_setting(Some(" s3cret ")).unwrap(), Some("s3cret"));
}

/// A finished root can linger before the first bootstrap of its id exists in this process (it
/// counts the communicator gone), and a root of its size can start in that window. Once the
/// id's first bootstrap exists here, that pick is forgotten: a stale rank is refused because the
/// communicator lives, not sent to the other root.
#[test]
fn a_successor_picked_before_the_communicator_existed_is_forgotten() {
    // A size no other test uses: the finished roots are one registry per process.
    const N: usize = 13;
    let listener = TcpListener::bind(localhost0()).unwrap();
    let addr = listener.local_addr().unwrap();
    let secret = super::unique_id::random_secret().unwrap();
    super::successor::linger(listener, secret, N, Duration::from_secs(2));
    let other = UniqueId::with_root(localhost0()).unwrap();
    super::successor::started(other, N);
    let member = super::successor::Member::new(secret);
    let stale = super::unique_id::UniqueId::from_parts(addr, secret);
    let e = Bootstrap::new(&stale, 1, N, cfg(10_000)).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("still lives"), "{m}");
    drop(member);
}

/// A survey (issue 46's hang diagnosis): every rank notes its calls; rank 3 stops after one.
/// While rank 3's program sits in a `recv` (its thread reading its connections) and rank 2's
/// sleeps outside the bootstrap, rank 0's survey gets every record within its deadline, and
/// `laggards` names rank 3 with its last call and no one else.
#[test]
fn a_survey_names_the_rank_that_stopped_calling() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let n = 4;
    let out = on_ranks(n, move |r| {
        let b = Bootstrap::new(&uid, r, n, cfg(10_000)).unwrap();
        b.note_call("ncclAllReduce", 4096);
        if r != 3 {
            b.note_call("ncclBroadcast", 8192);
        }
        b.barrier().unwrap();
        let mut found = None;
        match r {
            0 => {
                let t = Instant::now();
                let answers = b.survey(Duration::from_secs(2));
                let took = t.elapsed();
                let line = b.laggards(Duration::from_secs(2));
                b.send(3, 7, b"go").unwrap();
                found = Some((answers, took, line));
            }
            2 => thread::sleep(Duration::from_millis(300)),
            3 => assert_eq!(b.recv(0, 7).unwrap(), b"go"),
            _ => {}
        }
        b.barrier().unwrap();
        found
    });
    let (answers, took, line) = out.into_iter().next().flatten().unwrap();
    assert!(took < Duration::from_secs(2), "the survey took {took:?}");
    for (v, a) in answers.iter().enumerate() {
        let p = a.as_ref().unwrap_or_else(|e| panic!("rank {v}: {e}"));
        let want = if v == 3 {
            (1, "ncclAllReduce", 4096)
        } else {
            (2, "ncclBroadcast", 8192)
        };
        assert_eq!((p.calls, p.op.as_str(), p.bytes), want, "rank {v}");
        assert!(p.ago < Duration::from_secs(5), "rank {v}: {p}");
    }
    let line = line.expect("a rank is behind");
    assert!(
        line.contains("rank 3: call #1 ncclAllReduce of 4096 bytes"),
        "{line}"
    );
    assert!(
        line.starts_with("behind this rank (call #2)")
            && !line.contains("rank 1")
            && !line.contains("rank 2"),
        "{line}"
    );
}

/// The status service (issue 46): 64 ranks; rank 41 stops calling after 2 calls while the
/// others make 5 and wait in a barrier (their threads inside the bootstrap). One client with the
/// token, as `mscclpp-perf status` is, gets every rank's line within 2 s and rank 41 named as
/// behind with its last call; a wrong token is refused.
#[test]
fn the_status_command_names_the_rank_that_stopped_among_64() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let n = 64;
    let out = on_ranks(n, move |r| {
        let b = Arc::new(Bootstrap::new(&uid, r, n, cfg(30_000)).unwrap());
        for i in 0..if r == 41 { 2 } else { 5 } {
            b.note_call("allreduce", 1024 << i);
        }
        b.barrier().unwrap();
        let mut got = None;
        if r == 0 {
            let server = b.serve_status(localhost0()).unwrap();
            let t = Instant::now();
            let report = status::ask_status(server.addr(), server.token(), Duration::from_secs(5));
            let took = t.elapsed();
            let bad = status::ask_status(server.addr(), &"0".repeat(32), Duration::from_secs(5));
            got = Some((report, took, bad));
        }
        b.barrier().unwrap();
        got
    });
    let (report, took, bad) = out.into_iter().next().flatten().unwrap();
    let report = report.unwrap();
    assert!(
        took < Duration::from_secs(2),
        "the status took {took:?}:\n{report}"
    );
    assert_eq!(
        report.lines().filter(|l| l.starts_with("rank ")).count(),
        64,
        "{report}"
    );
    assert!(
        report.contains("rank 41: call #2 allreduce of 2048 bytes"),
        "{report}"
    );
    let last = report.lines().last().unwrap_or("");
    assert!(
        last.starts_with("behind (the most calls is 5): rank 41 (call #2 allreduce")
            && !last.contains("rank 40")
            && !last.contains("rank 42"),
        "{report}"
    );
    let e = bad.unwrap_err().to_string();
    assert!(e.contains("wrong token"), "{e}");
}

/// A join cancelled from another thread ends at once, for the rank that runs the root and for
/// one waiting on it, long before the deadline.
#[test]
fn a_cancelled_join_ends_at_once() {
    let uid = UniqueId::with_root(localhost0()).unwrap();
    let tokens = [Cancel::new(), Cancel::new()];
    let handles: Vec<_> = tokens
        .iter()
        .enumerate()
        .map(|(rank, c)| {
            let cfg = BootstrapConfig {
                cancel: Some(c.clone()),
                ..cfg(60_000)
            };
            thread::spawn(move || {
                let t = Instant::now();
                (Bootstrap::new(&uid, rank, 3, cfg).map(|_| ()), t)
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    for c in &tokens {
        c.cancel();
    }
    for (rank, h) in handles.into_iter().enumerate() {
        let (r, t) = h.join().unwrap();
        let e = r.expect_err("a join without its third rank cannot succeed");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "rank {rank} ended after {:?}",
            t.elapsed()
        );
        assert!(e.to_string().contains("cancelled"), "rank {rank}: {e}");
    }
    // A token cancelled before the join starts fails it before any connection.
    let c = Cancel::new();
    c.cancel();
    let cfg = BootstrapConfig {
        cancel: Some(c),
        ..cfg(60_000)
    };
    let e = Bootstrap::new(&UniqueId::with_root(localhost0()).unwrap(), 0, 2, cfg).unwrap_err();
    assert!(e.to_string().contains("cancelled"), "{e}");
}
