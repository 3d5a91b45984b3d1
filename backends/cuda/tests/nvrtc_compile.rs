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

fn required() -> bool {
    std::env::var("MSCCLPP_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
}

#[test]
fn nvrtc_reports_compile_errors_with_the_log_or_skipped() {
    if let Err(e) = nvrtc::nvrtc_version() {
        if !required() {
            report!("skipped: {e}");
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
