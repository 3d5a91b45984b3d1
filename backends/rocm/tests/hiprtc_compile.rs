//! The backend's own hipRTC path reports compile errors with the log, and copes with the MI300
//! targets and full target ids. (Every module the library owns is compiled for every target, by
//! hipRTC and by `hipcc`, in the tests crate's `kernels_compile`, which sees the crates that own
//! them.) Without hipRTC the tests print "skipped: <reason>" and return — unless
//! `MSCCLPP_REQUIRE_HIPRTC=1` (CI), where the first fails.

use mscclpp_gpu::device_api::DEVICE_API_CHECK;
use mscclpp_rocm::hiprtc;

/// Writes a line straight to the process's stderr, past the test harness's output capture, so
/// that "skipped: ..." and the compile summary show in every `cargo test` run (CI logs included).
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `reason` without the parenthesised list of the library files tried (`(tried …)`), which made
/// the "skipped" line 260 to 310 characters long; `MSCCLPP_LOG_LEVEL=debug` shows the files.
fn without_files_tried(reason: &str) -> String {
    match reason.find(" (tried ") {
        Some(start) => match reason[start..].find(')') {
            Some(len) => format!("{}{}", &reason[..start], &reason[start + len + 1..]),
            None => reason.to_owned(),
        },
        None => reason.to_owned(),
    }
}

#[test]
fn skipped_reasons_drop_the_files_tried() {
    assert_eq!(
        without_files_tried("X could not be opened (tried a.so, b.so; see why); install X"),
        "X could not be opened; install X"
    );
    assert_eq!(without_files_tried("no X"), "no X");
}

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

#[test]
fn hiprtc_reports_compile_errors_with_the_log_or_skipped() {
    if let Err(e) = hiprtc::hiprtc_version() {
        if !required("MSCCLPP_REQUIRE_HIPRTC") {
            report!("skipped: {}", without_files_tried(&e.to_string()));
            return;
        }
    }
    let err = hiprtc::compile(
        "broken.hip",
        "extern \"C\" __global__ void k() { this_is_not_declared(); }",
        &[],
        "gfx90a",
    )
    .expect_err("a broken source must not compile");
    let msg = err.to_string();
    assert!(msg.contains("this_is_not_declared"), "{msg}");
}

/// What this build's hipRTC does with the MI300 targets and with a full target id as a device
/// reports it (`gfx90a:sramecc+:xnack-`): reported, never a crash. The hipRTC inside Debian 12's
/// ROCm 5.2 `libamdhip64.so.5` aborts the whole process (SIGABRT, `munmap_chunk(): invalid
/// pointer`) for gfx940/gfx942 — checked with a plain C++ caller too — so the backend refuses
/// those targets with `Unavailable` before calling it; an MI300X machine compiles with its own
/// ROCm 6 hipRTC at run time. The backend compiles for the bare processor
/// (`probe::compile_target`); a full target id must compile too.
#[test]
fn hiprtc_outcome_for_mi300_targets_and_target_ids_is_reported_or_skipped() {
    let Ok((major, minor)) = hiprtc::hiprtc_version() else {
        report!("skipped: hipRTC unavailable");
        return;
    };
    let library = hiprtc::library_name().unwrap_or("?");
    let module = &DEVICE_API_CHECK;
    for arch in ["gfx90a:sramecc+:xnack-", "gfx940", "gfx942"] {
        match hiprtc::compile_module(module, arch) {
            Ok(c) => {
                report!(
                    "hipRTC {major}.{minor} ({library}): {} for {arch}: ok, {} bytes",
                    module.name,
                    c.code.len()
                );
                assert!(c.code.starts_with(b"\x7fELF"), "{arch}: not an ELF");
            }
            Err(e) => {
                report!(
                    "hipRTC {major}.{minor} ({library}): {} for {arch}: {e}",
                    module.name
                );
                assert!(arch.starts_with("gfx94"), "{arch} should compile: {e}");
                assert!(
                    matches!(
                        e,
                        mscclpp_hal::Error::Driver { .. } | mscclpp_hal::Error::Unavailable { .. }
                    ),
                    "{e}"
                );
            }
        }
    }
}
