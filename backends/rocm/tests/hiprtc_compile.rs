//! Compiles every embedded HIP module through the backend's own hipRTC path, and with `hipcc`,
//! for each target architecture, failing on errors and on warnings. Without the compiler the
//! tests print "skipped: <reason>" and return — unless `MSCCLPP_REQUIRE_HIPRTC=1` /
//! `MSCCLPP_REQUIRE_HIPCC=1` (CI), where they fail.

use std::path::Path;
use std::process::Command;

use mscclpp_gpu::sources::{self, DEVICE_API_CHECK, HIP_CORE, MODULES, Module, headers};
use mscclpp_hal::KernelId;
use mscclpp_rocm::hiprtc;

/// Writes a line straight to the process's stderr, past the test harness's output capture, so
/// that "skipped: ..." and the compile summary show in every `cargo test` run (CI logs included).
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

const ARCHS: &[&str] = &["gfx90a", "gfx908"];

fn compile(module: &Module, arch: &str) -> mscclpp_hal::Result<hiprtc::Compiled> {
    hiprtc::compile(module.name, module.source, &headers(HIP_CORE), arch)
}

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

fn modules() -> impl Iterator<Item = &'static Module> {
    MODULES.iter().chain([&DEVICE_API_CHECK])
}

fn has_warning(log: &str) -> bool {
    log.to_lowercase().contains("warning")
}

#[test]
fn hiprtc_compiles_every_module_for_gfx90a_gfx908_or_skipped() {
    let (major, minor) = match hiprtc::hiprtc_version() {
        Ok(v) => v,
        Err(e) if !required("MSCCLPP_REQUIRE_HIPRTC") => {
            report!("skipped: {e}");
            return;
        }
        Err(e) => panic!("MSCCLPP_REQUIRE_HIPRTC=1 but hipRTC is unusable: {e}"),
    };
    report!(
        "hipRTC {major}.{minor} ({})",
        hiprtc::library_name().unwrap_or("?")
    );
    let mut failures = Vec::new();
    for module in modules() {
        for arch in ARCHS {
            match compile(module, arch) {
                Ok(c) => {
                    report!(
                        "compiled {} for {arch} in {:.2} s: {} bytes of code object{}",
                        module.name,
                        c.elapsed.as_secs_f64(),
                        c.code.len(),
                        if c.log.is_empty() {
                            String::new()
                        } else {
                            format!("; log:\n{}", c.log)
                        }
                    );
                    if has_warning(&c.log) {
                        failures.push(format!("{} for {arch}: warnings:\n{}", module.name, c.log));
                    }
                    if !c.code.starts_with(b"\x7fELF") {
                        failures.push(format!(
                            "{} for {arch}: the code object is not an ELF",
                            module.name
                        ));
                    }
                    for k in module.kernels {
                        if !c
                            .code
                            .windows(k.name().len())
                            .any(|w| w == k.name().as_bytes())
                        {
                            failures.push(format!(
                                "{} for {arch}: no kernel {k} in the code object",
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
fn hiprtc_reports_compile_errors_with_the_log_or_skipped() {
    if let Err(e) = hiprtc::hiprtc_version() {
        if !required("MSCCLPP_REQUIRE_HIPRTC") {
            report!("skipped: {e}");
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

#[test]
fn hipcc_compiles_every_module_for_gfx90a_gfx908_or_skipped() {
    let must = required("MSCCLPP_REQUIRE_HIPCC");
    let version = Command::new("hipcc").arg("--version").output();
    match version {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let first = text
                .lines()
                .find(|l| l.contains("HIP version"))
                .unwrap_or("");
            report!("hipcc: {first}");
        }
        Ok(out) if !must => {
            report!("skipped: hipcc --version failed ({})", out.status);
            return;
        }
        Err(e) if !must => {
            report!("skipped: hipcc not found: {e}");
            return;
        }
        other => panic!("MSCCLPP_REQUIRE_HIPCC=1 but hipcc is unusable: {other:?}"),
    }
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
    let out_dir = std::env::temp_dir().join(format!("mscclpp-hipcc-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let mut failures = Vec::new();
    for module in modules() {
        let object = out_dir.join(module.name.replace('/', "_") + ".o");
        let mut cmd = Command::new("hipcc");
        for arch in ARCHS {
            cmd.arg(format!("--offload-arch={arch}"));
        }
        // HIP's core.cuh first, then the vendor-neutral headers; `.cu` files compile as HIP.
        cmd.args(["-std=c++17", "-Wall", "-c", "-x", "hip", "-I"])
            .arg(kernels.join("hip/include"))
            .arg("-I")
            .arg(kernels.join("include"))
            .arg("-I")
            .arg(&kernels)
            .arg(kernels.join(module.name))
            .arg("-o")
            .arg(&object);
        let start = std::time::Instant::now();
        let out = cmd.output().expect("hipcc ran a moment ago");
        let stderr = String::from_utf8_lossy(&out.stderr);
        report!(
            "hipcc {} for {} in {:.2} s: {}",
            module.name,
            ARCHS.join("+"),
            start.elapsed().as_secs_f64(),
            if out.status.success() { "ok" } else { "FAILED" }
        );
        if !out.status.success() || has_warning(&stderr) {
            failures.push(format!("hipcc {}: {}\n{stderr}", module.name, out.status));
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// What this build's hipRTC does with the MI300 targets and with a full target id as a device
/// reports it (`gfx90a:sramecc+:xnack-`): reported, never a crash. The hipRTC inside Debian 12's
/// ROCm 5.2 `libamdhip64.so.5` aborts the whole process (SIGABRT, `munmap_chunk(): invalid
/// pointer`) for gfx940/gfx942 — checked with a plain C++ caller too — so the backend refuses
/// those targets with `Unavailable` before calling it; an MI300X machine compiles with its own
/// ROCm 6 hipRTC at run time. The backend compiles for the bare processor
/// (`runtime::compile_target`); a full target id must compile too.
#[test]
fn hiprtc_outcome_for_mi300_targets_and_target_ids_is_reported_or_skipped() {
    let Ok((major, minor)) = hiprtc::hiprtc_version() else {
        report!("skipped: hipRTC unavailable");
        return;
    };
    let library = hiprtc::library_name().unwrap_or("?");
    let module = sources::module_for(KernelId::FILL_U32).expect("fill kernel is embedded");
    for arch in ["gfx90a:sramecc+:xnack-", "gfx940", "gfx942"] {
        match compile(module, arch) {
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
