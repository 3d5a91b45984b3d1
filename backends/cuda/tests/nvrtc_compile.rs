//! Compiles every embedded CUDA module through the backend's own NVRTC path for each target
//! architecture, failing on errors and on warnings. Without NVRTC the test prints
//! "skipped: <reason>" and returns — unless `MSCCLPP_REQUIRE_NVRTC=1` (CI), where it fails.

use mscclpp_cuda::nvrtc;
use mscclpp_gpu::sources::{CUDA_CORE, DEVICE_API_CHECK, MODULES, Module, headers};

/// Writes a line straight to the process's stderr, past the test harness's output capture, so
/// that "skipped: ..." and the compile summary show in every `cargo test` run (CI logs included).
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

const ARCHS: &[&str] = &["sm_80", "sm_90", "sm_100"];

fn compile(module: &Module, arch: &str) -> mscclpp_hal::Result<nvrtc::Compiled> {
    nvrtc::compile(module.name, module.source, &headers(CUDA_CORE), arch)
}

fn required() -> bool {
    std::env::var("MSCCLPP_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
}

#[test]
fn nvrtc_compiles_every_module_for_sm80_sm90_sm100_or_skipped() {
    let (major, minor) = match nvrtc::nvrtc_version() {
        Ok(v) => v,
        Err(e) if !required() => {
            report!("skipped: {e}");
            return;
        }
        Err(e) => panic!("MSCCLPP_REQUIRE_NVRTC=1 but NVRTC is unusable: {e}"),
    };
    report!(
        "NVRTC {major}.{minor} ({})",
        nvrtc::library_name().unwrap_or("?")
    );
    let mut failures = Vec::new();
    for module in MODULES.iter().chain([&DEVICE_API_CHECK]) {
        for arch in ARCHS {
            match compile(module, arch) {
                Ok(c) => {
                    report!(
                        "compiled {} for {arch} in {:.2} s: {} bytes of PTX, {} bytes of cubin{}",
                        module.name,
                        c.elapsed.as_secs_f64(),
                        c.ptx.len(),
                        c.cubin.as_ref().map_or(0, Vec::len),
                        if c.log.is_empty() {
                            String::new()
                        } else {
                            format!("; log:\n{}", c.log)
                        }
                    );
                    if c.log.to_lowercase().contains("warning") {
                        failures.push(format!("{} for {arch}: warnings:\n{}", module.name, c.log));
                    }
                    let ptx = String::from_utf8_lossy(&c.ptx);
                    if module.name == DEVICE_API_CHECK.name {
                        // Multicast is generated from sm_90 on, and only there; LL16 packets are
                        // one 16-byte store.
                        let multimem =
                            ptx.contains("multimem.ld_reduce.relaxed.sys.global.add.f32");
                        if multimem != (*arch != "sm_80") {
                            failures.push(format!("{arch}: multimem in the PTX: {multimem}"));
                        }
                        if !ptx.contains("st.volatile.global.v4.u32") {
                            failures.push(format!("{arch}: no 16-byte packet store in the PTX"));
                        }
                    }
                    for k in module.kernels {
                        if !ptx.contains(&format!(".entry {}(", k.name())) {
                            failures.push(format!(
                                "{} for {arch}: no entry {k} in the PTX",
                                module.name
                            ));
                        }
                    }
                }
                Err(e) => failures.push(format!("{} for {arch}: {e}", module.name)),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
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
