//! The plugin binding against the loopback plugin of `tests/fixtures/net_plugin.c`, compiled
//! here with the system C compiler once for each ABI version this binding speaks (v6 to v12), the
//! same suite stamped out for each: loading, properties, the non-blocking connect/accept,
//! messages both ways through registered buffers; then what is particular to some versions (the
//! v11+ context and its `finalize`, `int` sizes before v8/v9, the newest of several tables) and
//! the errors for a missing file and a missing symbol. A C compiler (`cc`, or `CC`) is required:
//! without one these tests fail saying so rather than pass untested.
//!
//! `MSCCLPP_TEST_REAL_NET_PLUGIN` names a plugin we did not write (aws-ofi-nccl, a vendor's);
//! the real-plugin test drives each table it exports the same way. Unset, that test says it is
//! skipped and why (no package registry CI can reach carries a net plugin that runs off its
//! vendor's cloud), unless `MSCCLPP_REQUIRE_REAL_NET_PLUGIN=1`, where it fails.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use super::plugin::{PTR_HOST, Plugin};

/// The fixture built with `-DFIXTURE_NET_VERSION=<each of versions>` into one library under the
/// name `tag` (a distinct file is a distinct copy of the plugin's state), once per test process.
fn build(tag: &str, versions: &[u32]) -> Result<PathBuf, String> {
    build_with(tag, versions, &[])
}

/// [`build`] with extra `-D` definitions.
fn build_with(tag: &str, versions: &[u32], defines: &[&str]) -> Result<PathBuf, String> {
    static BUILT: OnceLock<Mutex<HashMap<String, Result<PathBuf, String>>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    built
        .entry(tag.to_string())
        .or_insert_with(|| {
            let src =
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/net_plugin.c");
            let dir = std::env::temp_dir();
            let pid = std::process::id();
            let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
            let run = |args: &mut Command| -> Result<(), String> {
                let st = args
                    .status()
                    .map_err(|e| format!("no C compiler ({cc}): {e}"))?;
                st.success()
                    .then_some(())
                    .ok_or_else(|| format!("{cc} failed on {}: {st}", src.display()))
            };
            let mut objs = Vec::new();
            for v in versions {
                let o = dir.join(format!("net-fixture-{tag}-v{v}-{pid}.o"));
                run(Command::new(&cc)
                    .args(["-c", "-fPIC", "-O2", &format!("-DFIXTURE_NET_VERSION={v}")])
                    .args(defines.iter().map(|d| format!("-D{d}")))
                    .arg("-o")
                    .arg(&o)
                    .arg(&src))?;
                objs.push(o);
            }
            let out = dir.join(format!("libnccl-net-fixture-{tag}-{pid}.so"));
            let linked = run(Command::new(&cc)
                .args(["-shared", "-o"])
                .arg(&out)
                .args(&objs));
            for o in &objs {
                let _ = std::fs::remove_file(o);
            }
            linked.map(|()| out)
        })
        .clone()
}

fn fixture(version: u32) -> String {
    match build(&format!("v{version}"), &[version]) {
        Ok(p) => p.display().to_string(),
        Err(why) => panic!("the fixture net plugin (v{version}) cannot be built: {why}"),
    }
}

/// Connects a send comm to a receive comm of `p` on device `dev` (both ends in this process).
fn pair(p: &Plugin, dev: usize) -> (super::plugin::Comm, super::plugin::Comm) {
    let (mut handle, listen) = p.listen(dev).unwrap();
    let mut send = None;
    let mut recv = None;
    for _ in 0..10_000 {
        if send.is_none() {
            send = p.try_connect(dev, &mut handle).unwrap();
        }
        if recv.is_none() {
            recv = p.try_accept(&listen).unwrap();
        }
        if send.is_some() && recv.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    p.close_listen(listen).unwrap();
    (send.expect("connected"), recv.expect("accepted"))
}

/// A message each way of each size in `sizes` (then the comms close); the received bytes are
/// checked against what was sent, in a buffer poisoned first.
fn messages_cross(p: &Plugin, dev: usize, sizes: &[usize]) {
    let (send, recv) = pair(p, dev);
    let cap = sizes.iter().copied().max().unwrap_or(1);
    let mut sbuf = vec![0u8; cap];
    let mut rbuf = vec![0u8; cap];
    // SAFETY: both buffers outlive their registrations (deregistered below).
    let (smr, rmr) = unsafe {
        (
            p.reg_mr(&send, sbuf.as_mut_ptr(), sbuf.len()).unwrap(),
            p.reg_mr(&recv, rbuf.as_mut_ptr(), rbuf.len()).unwrap(),
        )
    };
    for &n in sizes {
        for (i, b) in sbuf[..n].iter_mut().enumerate() {
            *b = (i * 31 + n) as u8;
        }
        rbuf.fill(0xA5);
        let post = |what: &str, f: &mut dyn FnMut() -> Option<super::plugin::Request>| {
            for _ in 0..100_000 {
                if let Some(r) = f() {
                    return r;
                }
                std::thread::yield_now();
            }
            panic!("the plugin never took the {what} of {n} bytes");
        };
        // SAFETY: the buffers are not touched until the requests complete (tested below).
        let rq = post("receive", &mut || unsafe {
            p.irecv(&recv, rbuf.as_mut_ptr(), rbuf.len(), &rmr).unwrap()
        });
        // SAFETY: as above.
        let sq = post("send", &mut || unsafe {
            p.isend(&send, sbuf.as_mut_ptr(), n, &smr).unwrap()
        });
        let (mut got_r, mut got_s) = (None, None);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while got_r.is_none() || got_s.is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "{n} bytes not moved in 60 s"
            );
            if got_s.is_none() {
                got_s = p.test(&sq).unwrap();
            }
            if got_r.is_none() {
                got_r = p.test(&rq).unwrap();
            }
        }
        assert_eq!(got_r, Some(n), "received size of {n} bytes");
        assert!(got_s.is_some());
        assert_eq!(&rbuf[..n], &sbuf[..n], "{n} bytes");
    }
    p.dereg_mr(&send, smr).unwrap();
    p.dereg_mr(&recv, rmr).unwrap();
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

/// The suite, once for each ABI version.
macro_rules! each_version {
    ($($m:ident: $v:expr),*) => {$(
        mod $m {
            use super::*;

            #[test]
            fn loads_its_table_and_reports_properties() {
                let p = Plugin::open(&fixture($v)).expect("fixture loads");
                assert_eq!((p.version, p.name.as_str()), ($v, "fixture"));
                assert_eq!(p.devices().unwrap(), 1);
                let props = p.properties(0).unwrap();
                assert_eq!(props.name, "fixture-tcp0");
                assert_eq!(props.pci_path, "/sys/devices/virtual/net/lo");
                assert_eq!(props.guid, 0x6669_7874_7572_6500);
                assert_eq!(props.ptr_support, PTR_HOST);
                assert_eq!(props.speed_mbps, 400_000);
                assert_eq!((props.port, props.max_comms, props.max_recvs), (1, 65536, 1));
                let p2p = if $v >= 9 { Some(1usize << 30) } else { None };
                assert_eq!(props.max_p2p_bytes, p2p, "maxP2pBytes of v{}", $v);
                let e = p.properties(3).unwrap_err().to_string();
                assert!(e.contains("getProperties") && e.contains("invalid argument"), "{e}");
            }

            /// Sizes 1 B to 3 MiB, each way.
            #[test]
            fn messages_cross_both_ways() {
                let p = Plugin::open(&fixture($v)).unwrap();
                messages_cross(&p, 0, &[1, 4095, 1 << 20, 3 << 20]);
            }
        }
    )*};
}
each_version!(v6: 6, v7: 7, v8: 8, v9: 9, v10: 10, v11: 11, v12: 12);

/// v11 and v12: the context `init` returns is the one `listen`/`connect` get (the fixture
/// refuses any other), and dropping the plugin finalises it.
#[test]
fn the_v11_context_is_passed_and_finalised() {
    for v in [11u32, 12] {
        // A copy of its own, so no other test's plugin counts in its contexts.
        let path = build(&format!("finalize-v{v}"), &[v]).expect("fixture builds");
        // SAFETY: the fixture's initialisers are trivial; it stays loaded while `lib` lives.
        let lib = unsafe { libloading::Library::new(&path) }.unwrap();
        // SAFETY: `fixture_live_contexts` is `int (void)` in the fixture.
        let live = unsafe { lib.get::<unsafe extern "C" fn() -> i32>(b"fixture_live_contexts\0") }
            .unwrap();
        // SAFETY: as above; a plain call.
        let count = || unsafe { live() };
        assert_eq!(count(), 0);
        let p = Plugin::open(path.to_str().unwrap()).unwrap();
        assert_eq!(p.version, v);
        assert_eq!(count(), 1, "v{v}: init made one context");
        messages_cross(&p, 0, &[17]);
        drop(p);
        assert_eq!(
            count(),
            0,
            "v{v}: dropping the plugin finalised its context"
        );
    }
}

/// A library exporting v8 and v12 tables (as real plugins export every version they speak): the
/// newest is taken.
#[test]
fn the_newest_of_several_tables_is_taken() {
    let path = build("v8+v12", &[8, 12]).expect("fixture builds");
    let p = Plugin::open(path.to_str().unwrap()).unwrap();
    assert_eq!(p.version, 12);
    messages_cross(&p, 0, &[1000]);
}

/// `MSCCLPP_NET_PLUGIN_ABI` caps the version taken; a cap outside 6..=12, or below every
/// table, is an error naming it.
#[test]
fn the_version_taken_can_be_capped() {
    let path = build("v8+v12", &[8, 12]).expect("fixture builds");
    let path = path.to_str().unwrap();
    let p = Plugin::open_with(path, Some(11)).unwrap();
    assert_eq!(p.version, 8);
    messages_cross(&p, 0, &[333]);
    let e = Plugin::open_with(path, Some(13)).unwrap_err().to_string();
    assert!(e.contains("MSCCLPP_NET_PLUGIN_ABI=13"), "{e}");
    let e = Plugin::open_with(path, Some(7)).unwrap_err().to_string();
    assert!(
        e.contains("ncclNetPlugin_v7") && e.contains("none newer than v7"),
        "{e}"
    );
}

/// Before v8 `regMr` takes an `int`, before v9 `isend`/`irecv` do: larger sizes are refused
/// here, naming the size and the version, instead of being truncated.
#[test]
fn int_sizes_of_old_versions_are_refused_not_truncated() {
    let p = Plugin::open(&fixture(7)).unwrap();
    let (send, recv) = pair(&p, 0);
    let mut b = vec![0u8; 64];
    let huge = 3usize << 30;
    // SAFETY: the length is refused before the plugin is called, so nothing reads past `b`.
    let e = unsafe { p.reg_mr(&send, b.as_mut_ptr(), huge) }
        .unwrap_err()
        .to_string();
    assert!(e.contains(&huge.to_string()) && e.contains("v7"), "{e}");
    // SAFETY: a registration of the whole of `b`, deregistered below.
    let mr = unsafe { p.reg_mr(&send, b.as_mut_ptr(), b.len()) }.unwrap();
    // SAFETY: refused before the plugin is called, as above.
    let e = unsafe { p.isend(&send, b.as_mut_ptr(), huge, &mr) }
        .unwrap_err()
        .to_string();
    assert!(e.contains("send") && e.contains("v7"), "{e}");
    // SAFETY: as above.
    let e = unsafe { p.irecv(&recv, b.as_mut_ptr(), huge, &mr) }
        .unwrap_err()
        .to_string();
    assert!(e.contains("receive") && e.contains("v7"), "{e}");
    p.dereg_mr(&send, mr).unwrap();
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

/// v8: `regMr` takes a `size_t` (a registration above 2^31-1 goes to the plugin), `isend` and
/// `irecv` still an `int` (refused here).
#[test]
fn v8_registers_large_ranges_but_refuses_large_transfers() {
    let p = Plugin::open(&fixture(8)).unwrap();
    let (send, recv) = pair(&p, 0);
    let mut b = vec![0u8; 64];
    let huge = 3usize << 30;
    // SAFETY: the fixture's regMr records nothing of the range and never touches it; the
    // handle is deregistered below without any transfer on it.
    let big = unsafe { p.reg_mr(&send, b.as_mut_ptr(), huge) }.expect("v8 regMr takes a size_t");
    p.dereg_mr(&send, big).unwrap();
    // SAFETY: a registration of the whole of `b`, deregistered below.
    let mr = unsafe { p.reg_mr(&send, b.as_mut_ptr(), b.len()) }.unwrap();
    // SAFETY: refused before the plugin is called, so nothing reads past `b`.
    let e = unsafe { p.isend(&send, b.as_mut_ptr(), huge, &mr) }
        .unwrap_err()
        .to_string();
    assert!(e.contains("send") && e.contains("v8"), "{e}");
    // SAFETY: as above.
    let e = unsafe { p.irecv(&recv, b.as_mut_ptr(), huge, &mr) }
        .unwrap_err()
        .to_string();
    assert!(e.contains("receive") && e.contains("v8"), "{e}");
    p.dereg_mr(&send, mr).unwrap();
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

/// A plugin whose `init` fails is an error naming the call, and (v11+) it is never finalised:
/// there is no context to end.
#[test]
fn a_failed_init_is_an_error_and_never_finalised() {
    for v in [8u32, 11, 12] {
        let path = build_with(
            &format!("failinit-v{v}"),
            &[v],
            &["FIXTURE_NET_FAIL_INIT_BUILD"],
        )
        .expect("fixture builds");
        // SAFETY: the fixture's initialisers are trivial; it stays loaded while `lib` lives.
        let lib = unsafe { libloading::Library::new(&path) }.unwrap();
        let e = Plugin::open(path.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("init") && e.contains("internal error"),
            "v{v}: {e}"
        );
        if v >= 11 {
            // SAFETY: `fixture_finalize_calls` is `int (void)` in the fixture's v11+ builds.
            let calls =
                unsafe { lib.get::<unsafe extern "C" fn() -> i32>(b"fixture_finalize_calls\0") }
                    .unwrap();
            // SAFETY: a plain call.
            assert_eq!(unsafe { calls() }, 0, "v{v}: finalize after a failed init");
        }
    }
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
        e.contains("ncclNetPlugin_v12") && e.contains("ncclNetPlugin_v6"),
        "{e}"
    );
}

/// A plugin we did not write (`MSCCLPP_TEST_REAL_NET_PLUGIN`): through each table it exports,
/// it loads, reports its devices, and carries messages both ways on its device 0. Each table is
/// driven in a process of its own (this test run again, `NET_TEST_ABI` naming the version), as
/// NCCL initialises a plugin once per process and real plugins are written for that.
#[test]
fn a_real_plugin_carries_messages() {
    let Ok(path) = std::env::var("MSCCLPP_TEST_REAL_NET_PLUGIN") else {
        let why = "skipped: MSCCLPP_TEST_REAL_NET_PLUGIN names no plugin";
        if std::env::var("MSCCLPP_REQUIRE_REAL_NET_PLUGIN").as_deref() == Ok("1") {
            panic!("{why}, and MSCCLPP_REQUIRE_REAL_NET_PLUGIN=1 requires one");
        }
        eprintln!("a_real_plugin_carries_messages {why}");
        return;
    };
    if let Ok(v) = std::env::var("NET_TEST_ABI") {
        let v: u32 = v.parse().expect("NET_TEST_ABI is a version");
        let p = Plugin::open_with(&path, Some(v)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(p.version, v);
        let n = p.devices().unwrap();
        assert!(n >= 1, "{} v{v} reports no device", p.name);
        for d in 0..n {
            let props = p.properties(d).unwrap();
            eprintln!("{} v{v} device {d}: {props:?}", p.name);
            assert!(
                props.ptr_support & PTR_HOST != 0,
                "device {d} takes no host memory"
            );
        }
        messages_cross(&p, 0, &[1, 4095, 1 << 20, 3 << 20]);
        return;
    }
    // Which tables the file has (read without initialising it).
    // SAFETY: loading the plugin runs its initialisers, as any use of it does.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap_or_else(|e| panic!("{path}: {e}"));
    let versions: Vec<u32> = (6..=12)
        .rev()
        .filter(|v| {
            let sym = format!("ncclNetPlugin_v{v}\0");
            // SAFETY: only the symbol's presence is looked at.
            unsafe { lib.get::<*const u8>(sym.as_bytes()) }.is_ok()
        })
        .collect();
    drop(lib);
    assert!(
        !versions.is_empty(),
        "{path} exports no table this build speaks"
    );
    let exe = std::env::current_exe().unwrap();
    for v in &versions {
        let out = Command::new(&exe)
            .args([
                "--exact",
                "net::tests::a_real_plugin_carries_messages",
                "--nocapture",
            ])
            .env("NET_TEST_ABI", v.to_string())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        eprintln!("--- v{v}\n{}", text.trim_end());
        assert!(
            out.status.success(),
            "{path} through its v{v} table failed: {text}"
        );
    }
    eprintln!("{path}: tables driven {versions:?}");
}
