//! The plugin binding against the loopback plugin of `tests/fixtures/net_plugin.c` (compiled
//! here with the system C compiler; the tests report themselves skipped where there is none):
//! loading, properties, the non-blocking connect/accept, messages both ways through registered
//! buffers, and the errors for a missing file and a missing symbol. A C compiler (`cc`, or `CC`)
//! is required: without one these tests fail saying so rather than pass untested.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use super::plugin::Plugin;

/// The fixture plugin, built once per test process; `Err` with the reason when it cannot be.
fn fixture() -> Result<PathBuf, String> {
    static P: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    P.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/net_plugin.c");
        let out =
            std::env::temp_dir().join(format!("libnccl-net-fixture-{}.so", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let st = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .map_err(|e| format!("no C compiler ({cc}): {e}"))?;
        if !st.success() {
            return Err(format!("{cc} failed on {}: {st}", src.display()));
        }
        Ok(out)
    })
    .clone()
}

macro_rules! need_fixture {
    () => {
        match fixture() {
            Ok(p) => p,
            Err(why) => panic!("the fixture net plugin cannot be built: {why}"),
        }
    };
}

#[test]
fn loads_the_newest_table_and_reports_properties() {
    let path = need_fixture!();
    let p = Plugin::open(path.to_str().unwrap()).expect("fixture loads");
    assert_eq!((p.version, p.name.as_str()), (8, "fixture"));
    assert_eq!(p.devices().unwrap(), 1);
    let props = p.properties(0).unwrap();
    assert_eq!(props.name, "fixture-tcp0");
    assert_eq!(props.ptr_support, super::plugin::PTR_HOST);
    assert_eq!(props.speed_mbps, 400_000);
    assert_eq!(props.max_p2p_bytes, None, "v8 has no maxP2pBytes");
    let e = p.properties(3).unwrap_err().to_string();
    assert!(
        e.contains("getProperties") && e.contains("invalid argument"),
        "{e}"
    );
}

/// A message each way between a connect and an accept of one process, through registered
/// buffers, sizes 1 B to 3 MiB; then the comms close.
#[test]
fn messages_cross_both_ways() {
    let path = need_fixture!();
    let p = Plugin::open(path.to_str().unwrap()).unwrap();
    let (mut handle, listen) = p.listen(0).unwrap();
    let mut send = None;
    let mut recv = None;
    for _ in 0..10_000 {
        if send.is_none() {
            send = p.try_connect(0, &mut handle).unwrap();
        }
        if recv.is_none() {
            recv = p.try_accept(&listen).unwrap();
        }
        if send.is_some() && recv.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let (send, recv) = (send.expect("connected"), recv.expect("accepted"));
    p.close_listen(listen).unwrap();
    let mut sbuf = vec![0u8; 3 << 20];
    let mut rbuf = vec![0u8; 3 << 20];
    // SAFETY: both buffers outlive their registrations (deregistered below).
    let (smr, rmr) = unsafe {
        (
            p.reg_mr(&send, sbuf.as_mut_ptr(), sbuf.len()).unwrap(),
            p.reg_mr(&recv, rbuf.as_mut_ptr(), rbuf.len()).unwrap(),
        )
    };
    for n in [1usize, 4095, 1 << 20, 3 << 20] {
        for (i, b) in sbuf[..n].iter_mut().enumerate() {
            *b = (i * 31 + n) as u8;
        }
        // SAFETY: the buffers are not touched until the requests complete (tested below).
        let (rq, sq) = unsafe {
            (
                p.irecv(&recv, rbuf.as_mut_ptr(), rbuf.len(), &rmr)
                    .unwrap()
                    .unwrap(),
                p.isend(&send, sbuf.as_mut_ptr(), n, &smr).unwrap().unwrap(),
            )
        };
        let (mut got_r, mut got_s) = (None, None);
        while got_r.is_none() || got_s.is_none() {
            if got_s.is_none() {
                got_s = p.test(&sq).unwrap();
            }
            if got_r.is_none() {
                got_r = p.test(&rq).unwrap();
            }
        }
        assert_eq!((got_s, got_r), (Some(n), Some(n)));
        assert_eq!(&rbuf[..n], &sbuf[..n], "{n} bytes");
    }
    p.dereg_mr(&send, smr).unwrap();
    p.dereg_mr(&recv, rmr).unwrap();
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

#[test]
fn a_missing_file_or_symbol_is_an_error_naming_it() {
    let e = Plugin::open("/nonexistent/libnccl-net-nothing.so")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/nonexistent/libnccl-net-nothing.so") && e.contains("could not be opened"),
        "{e}"
    );
    // libc is a shared library without the plugin's symbols.
    let e = Plugin::open("libc.so.6").unwrap_err().to_string();
    assert!(
        e.contains("ncclNetPlugin_v10") && e.contains("ncclNetPlugin_v8"),
        "{e}"
    );
}
