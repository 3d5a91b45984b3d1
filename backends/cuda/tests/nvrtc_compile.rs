//! The backend's own NVRTC path reports a compile error with the compiler's log. (Every module
//! the library owns is compiled for every target by the tests crate's `kernels_compile`, which
//! sees the crates that own them.) Without NVRTC the test prints "skipped: <reason>" and
//! returns — unless `MSCCLPP_REQUIRE_NVRTC=1` (CI), where it fails.

use mscclpp_cuda::nvrtc;

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

fn required() -> bool {
    std::env::var("MSCCLPP_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
}

#[test]
fn nvrtc_reports_compile_errors_with_the_log_or_skipped() {
    if let Err(e) = nvrtc::nvrtc_version() {
        if !required() {
            report!("skipped: {}", without_files_tried(&e.to_string()));
            return;
        }
    }
    let err = nvrtc::compile(
        "broken.cu",
        "extern \"C\" __global__ void k() { this_is_not_declared(); }",
        &[],
        "sm_90",
    )
    .expect_err("a broken source must not compile");
    let msg = err.to_string();
    assert!(msg.contains("this_is_not_declared"), "{msg}");
    assert!(msg.contains("broken.cu"), "{msg}");
}
