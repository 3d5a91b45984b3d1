//! Compiles every kernel module the library owns — the collectives' (`mscclpp-collectives`), the
//! benchmark kernels (`mscclpp-perf`), the conformance kernels (this crate), the device-API check
//! the execution-plan interpreter (`mscclpp-executor`) and the GIN proxy's signal add
//! (`mscclpp-nccl`) —
//! through each GPU backend's own run-time compile path (NVRTC for sm_80, sm_90 and sm_100;
//! hipRTC for gfx90a and gfx908) and with `hipcc` from the files on disk, failing on errors and
//! on warnings. No device is needed. Without the compiler a test is reported ignored with the
//! reason — unless `MSCCLPP_REQUIRE_NVRTC=1` / `MSCCLPP_REQUIRE_HIPRTC=1` /
//! `MSCCLPP_REQUIRE_HIPCC=1` (CI, through `ci/install-toolchains.sh`), where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use libtest_mimic::{Completion, Trial};
use mscclpp::hal::KernelModule;

/// Writes a line straight to the process's stderr, past the test harness's output capture, so
/// that the compile summary shows in every `cargo test` run (CI logs included).
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Every module with a device source, each named by its path under `kernels/`.
fn modules() -> Vec<&'static KernelModule> {
    let mut all: Vec<&'static KernelModule> = mscclpp::collectives::MODULES.to_vec();
    all.push(&mscclpp_perf::bench_kernels::MODULE);
    all.push(&mscclpp_perf::bench_compute::MODULE);
    all.push(&mscclpp_conformance::kernels::MODULE);
    all.push(&mscclpp_gpu::device_api::DEVICE_API_CHECK);
    all.push(&mscclpp_executor::kernel::EXECUTOR_MODULE);
    all.push(&mscclpp_nccl::devapi::gin::MODULE);
    all
}

/// The architectures `module` is compiled for here: every one of `all`, except that the modules
/// of the wide element types (`*_wide.cu`: 64-bit, 8-bit and FP8 collectives, compiled at run time
/// only when such a type is used) get the first only, unless `MSCCLPP_COMPILE_EVERY_ARCH=1`.
/// They are the largest modules by far (hipcc alone spent minutes on one); the same body is
/// compiled for every architecture through the base modules, so one architecture per compiler
/// checks what is particular to the wide types while CI stays within its time.
fn archs_for<'a>(module: &KernelModule, all: &'a [&'a str]) -> &'a [&'a str] {
    if first_arch_only(module.name) && !required("MSCCLPP_COMPILE_EVERY_ARCH") {
        &all[..1]
    } else {
        all
    }
}

/// Whether `module` (a name) is compiled for the first architecture only by default.
fn first_arch_only(module: &str) -> bool {
    module.ends_with("_wide.cu")
}

fn kernels_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels")
}

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

fn has_warning(log: &str) -> bool {
    log.to_lowercase().contains("warning")
}

#[cfg(any(feature = "cuda", feature = "rocm"))]
fn log_suffix(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!("; log:\n{log}")
    }
}

/// Every `.cu` file under `dir`, as paths relative to `root`.
fn device_sources(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            device_sources(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "cu") {
            let rel = path.strip_prefix(root).unwrap();
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

fn every_device_source_on_disk_is_a_module_and_matches_it() {
    let root = kernels_dir();
    let mut on_disk = Vec::new();
    device_sources(&root, &root, &mut on_disk);
    on_disk.sort();
    let mut listed: Vec<String> = modules().iter().map(|m| m.name.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "kernels/**/*.cu and the modules differ");
    for m in modules() {
        let text = std::fs::read_to_string(root.join(m.name)).unwrap();
        assert!(text == m.source, "{}: the embedded source is stale", m.name);
        for k in m.kernels {
            // A C++ kernel is named by its mangled name (`_ZN...`): the PTX check below finds it
            // as an entry; every other is an extern "C" definition in the source.
            if k.id.0.starts_with("_Z") {
                continue;
            }
            let def = format!("extern \"C\" __global__ void {}(", k.id);
            assert!(
                m.source.contains(&def),
                "{} does not define {}",
                m.name,
                k.id
            );
        }
        for (name, contents) in m.headers {
            let text = std::fs::read_to_string(root.join(name)).unwrap();
            assert!(text == *contents, "{}: header {name} is stale", m.name);
        }
    }
}

fn nvrtc_compiles_every_module_for_sm80_sm90_sm100_or_skipped() -> Completion {
    #[cfg(feature = "cuda")]
    return nvrtc::compile_all();
    #[cfg(not(feature = "cuda"))]
    {
        assert!(
            !required("MSCCLPP_REQUIRE_NVRTC"),
            "MSCCLPP_REQUIRE_NVRTC=1 but this build has no `cuda` feature"
        );
        Completion::ignored_with("built without the `cuda` feature")
    }
}

/// The PTX of every module, recorded in `kernels/ptx-digests.txt` (its size and FNV-1a digest
/// per architecture, with the compiler that made it): a change to a kernel, to a header it
/// includes or to the compile options changes the PTX, and this check then fails, naming each
/// module whose PTX moved, until the record is made again (`MSCCLPP_BLESS_PTX=1`) — so that a
/// change to the generated code is a visible, explained step of its own. With another compiler
/// than the recorded one the PTX is not compared (its header and code differ anyway), and says so.
#[cfg(feature = "cuda")]
mod ptx_digests {
    use std::collections::BTreeMap;

    use super::*;

    const FILE: &str = "ptx-digests.txt";
    const BLESS: &str = "MSCCLPP_BLESS_PTX";

    pub struct Entry {
        module: String,
        arch: String,
        bytes: usize,
        digest: u64,
        compiler: String,
    }

    impl Entry {
        pub fn of(module: &str, arch: &str, ptx: &[u8]) -> Entry {
            let text = String::from_utf8_lossy(ptx);
            // NVRTC's PTX opens with `// Compiler Build ID: CL-…` and `// Cuda compilation
            // tools, release …, V…`: together they name the compiler exactly.
            let line = |prefix: &str| {
                text.lines()
                    .take(12)
                    .find_map(|l| l.strip_prefix(prefix))
                    .unwrap_or("?")
                    .trim()
                    .to_owned()
            };
            Entry {
                module: module.to_owned(),
                arch: arch.to_owned(),
                bytes: ptx.len(),
                digest: fnv1a(ptx),
                compiler: format!(
                    "{} ({})",
                    line("// Cuda compilation tools, "),
                    line("// Compiler Build ID: ")
                ),
            }
        }
    }

    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    fn render(entries: &[&Entry]) -> String {
        let mut out = String::from(
            "# The PTX of every kernel module as NVRTC compiles it for each architecture of\n\
             # tests/tests/kernels_compile.rs: module, architecture, bytes, FNV-1a 64 digest.\n\
             # A change to a kernel, a header or the compile options changes these lines; make them\n\
             # again with `MSCCLPP_BLESS_PTX=1 cargo test -p mscclpp-conformance --test kernels_compile`\n\
             # and say in the commit why the generated code changed.\n",
        );
        out += &format!(
            "compiler {}\n",
            entries.first().map_or("?", |e| &e.compiler)
        );
        for e in entries {
            out += &format!("{} {} {} {:016x}\n", e.module, e.arch, e.bytes, e.digest);
        }
        out
    }

    /// What differs from the record (or nothing, when the record was just made or the compiler
    /// is another).
    pub fn check(entries: &[Entry]) -> Vec<String> {
        let path = kernels_dir().join(FILE);
        let extra = mscclpp::cuda::nvrtc::extra_compile_options();
        if !extra.is_empty() {
            // Extra options change the PTX without changing the compiler line.
            if required(BLESS) {
                return vec![format!(
                    "{BLESS}=1 with MSCCLPP_NVRTC_OPTIONS={extra:?}: the record is of the library's own options only"
                )];
            }
            report!("PTX digests: not compared (MSCCLPP_NVRTC_OPTIONS={extra:?})");
            return Vec::new();
        }
        if required(BLESS) {
            let defaults: Vec<&Entry> = entries
                .iter()
                .filter(|e| archs_for_is_default(&e.module, &e.arch))
                .collect();
            std::fs::write(&path, render(&defaults))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            report!(
                "PTX digests: {} recorded in {}",
                entries.len(),
                path.display()
            );
            return Vec::new();
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            return vec![format!(
                "{} is missing: make it with {BLESS}=1",
                path.display()
            )];
        };
        let mut recorded_by = "";
        let mut recorded = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            if let Some(c) = line.strip_prefix("compiler ") {
                recorded_by = c.trim();
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            match f[..] {
                [m, a, b, d] => {
                    let key = (m.to_owned(), a.to_owned());
                    if recorded.insert(key, (b.to_owned(), d.to_owned())).is_some() {
                        return vec![format!("{}: {m} for {a} is recorded twice", path.display())];
                    }
                }
                _ => return vec![format!("{}: malformed line {line:?}", path.display())],
            }
        }
        if recorded_by.is_empty() {
            return vec![format!("{}: no `compiler` line", path.display())];
        }
        let here = entries.first().map_or("?", |e| e.compiler.as_str());
        if here != recorded_by {
            // CI installs the recorded compiler (ci/install-toolchains.sh), so there this is
            // an error; elsewhere another compiler's PTX is simply not comparable.
            let why = format!("PTX digests: recorded with {recorded_by}, this is {here}");
            if required("MSCCLPP_REQUIRE_NVRTC") {
                return vec![format!(
                    "{why}: install the recorded NVRTC, or record this one's PTX with {BLESS}=1"
                )];
            }
            report!("{why}: the PTX is not compared");
            return Vec::new();
        }
        let mut wrong = Vec::new();
        let mut same = 0;
        for e in entries {
            match recorded.remove(&(e.module.clone(), e.arch.clone())) {
                Some((b, d)) if b == e.bytes.to_string() && d == format!("{:016x}", e.digest) => {
                    same += 1;
                }
                Some((b, _)) => wrong.push(format!(
                    "the PTX of {} for {} changed ({b} bytes recorded, {} now): if the change is \
                     meant, record it with {BLESS}=1 and say why in the commit",
                    e.module, e.arch, e.bytes
                )),
                // A wide module compiled for every architecture (MSCCLPP_COMPILE_EVERY_ARCH).
                None if !archs_for_is_default(&e.module, &e.arch) => {}
                None => wrong.push(format!(
                    "{} for {} has no recorded PTX (a new module?): record it with {BLESS}=1",
                    e.module, e.arch
                )),
            }
        }
        for (m, a) in recorded.keys() {
            wrong.push(format!(
                "{m} for {a} is recorded but was not compiled (removed?)"
            ));
        }
        report!(
            "PTX digests: {same} of {} identical to the record",
            entries.len()
        );
        wrong
    }

    /// Whether `arch` is one `module` is compiled for by default (see [`archs_for`]).
    fn archs_for_is_default(module: &str, arch: &str) -> bool {
        !first_arch_only(module) || arch == super::nvrtc::ARCHS[0]
    }
}

#[cfg(feature = "cuda")]
mod nvrtc {
    use mscclpp::cuda::nvrtc;
    use mscclpp_gpu::device_api::DEVICE_API_CHECK;

    use super::*;

    pub(super) const ARCHS: &[&str] = &["sm_80", "sm_90", "sm_100"];

    pub fn compile_all() -> Completion {
        let (major, minor) = match nvrtc::nvrtc_version() {
            Ok(v) => v,
            Err(e) if !required("MSCCLPP_REQUIRE_NVRTC") => {
                return Completion::ignored_with(mscclpp_conformance::harness::ignore_reason(e));
            }
            Err(e) => panic!("MSCCLPP_REQUIRE_NVRTC=1 but NVRTC is unusable: {e}"),
        };
        report!(
            "NVRTC {major}.{minor} ({})",
            nvrtc::library_name().unwrap_or("?")
        );
        let mut failures = Vec::new();
        let mut compiled = 0;
        let mut digests = Vec::new();
        for module in modules() {
            for arch in archs_for(module, ARCHS) {
                let c = match nvrtc::compile_module(module, arch) {
                    Ok(c) => c,
                    Err(e) => {
                        failures.push(format!("{} for {arch}: {e}", module.name));
                        continue;
                    }
                };
                compiled += 1;
                report!(
                    "compiled {} for {arch} in {:.2} s: {} bytes of PTX, {} bytes of cubin{}",
                    module.name,
                    c.elapsed.as_secs_f64(),
                    c.ptx.len(),
                    c.cubin.as_ref().map_or(0, Vec::len),
                    log_suffix(&c.log)
                );
                if has_warning(&c.log) {
                    failures.push(format!("{} for {arch}: warnings:\n{}", module.name, c.log));
                }
                if let Some(dir) = std::env::var_os("MSCCLPP_PTX_DUMP") {
                    let dir = std::path::Path::new(&dir);
                    let file = dir.join(format!("{}.{arch}.ptx", module.name.replace('/', "_")));
                    std::fs::create_dir_all(dir)
                        .and_then(|()| std::fs::write(&file, &c.ptx))
                        .unwrap_or_else(|e| panic!("MSCCLPP_PTX_DUMP: {}: {e}", file.display()));
                }
                digests.push(ptx_digests::Entry::of(module.name, arch, &c.ptx));
                let ptx = String::from_utf8_lossy(&c.ptx);
                for k in module.kernels {
                    // The name the loader asks for (mangled where the kernel is C++).
                    assert!(
                        ptx.contains(&format!(".entry {}(", k.id)),
                        "{} for {arch}: no entry {}",
                        module.name,
                        k.id
                    );
                }
                if module.name == DEVICE_API_CHECK.name {
                    // Multicast is generated from sm_90 on, and only there; LL16 packets are one
                    // 16-byte store.
                    let multimem = ptx.contains("multimem.ld_reduce.relaxed.sys.global.add.f32");
                    if multimem != (*arch != "sm_80") {
                        failures.push(format!("{arch}: multimem in the PTX: {multimem}"));
                    }
                    if !ptx.contains("st.volatile.global.v4.u32") {
                        failures.push(format!("{arch}: no 16-byte packet store in the PTX"));
                    }
                }
                // The interpreter's launch bounds (on its declaration) reach the PTX: the planner
                // launches up to 1024 threads per block.
                if module.name == mscclpp_executor::kernel::EXECUTOR_MODULE.name
                    && !ptx.contains(".maxntid 1024")
                {
                    failures.push(format!("{arch}: the executor's PTX has no .maxntid 1024"));
                }
                for k in module.kernels {
                    if !ptx.contains(&format!(".entry {}(", k.id)) {
                        failures.push(format!(
                            "{} for {arch}: no entry {} in the PTX",
                            module.name, k.id
                        ));
                    }
                }
            }
        }
        report!(
            "NVRTC: {compiled} compiles ({} modules, {} targets; wide modules: the first)",
            modules().len(),
            ARCHS.len()
        );
        if failures.is_empty() {
            failures.extend(ptx_digests::check(&digests));
        }
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
        Completion::Completed
    }
}

const HIP_ARCHS: &[&str] = &["gfx90a", "gfx908"];

fn hiprtc_compiles_every_module_for_gfx90a_gfx908_or_skipped() -> Completion {
    #[cfg(feature = "rocm")]
    return hiprtc::compile_all();
    #[cfg(not(feature = "rocm"))]
    {
        assert!(
            !required("MSCCLPP_REQUIRE_HIPRTC"),
            "MSCCLPP_REQUIRE_HIPRTC=1 but this build has no `rocm` feature"
        );
        Completion::ignored_with("built without the `rocm` feature")
    }
}

#[cfg(feature = "rocm")]
mod hiprtc {
    use mscclpp::rocm::hiprtc;

    use super::*;

    pub fn compile_all() -> Completion {
        let (major, minor) = match hiprtc::hiprtc_version() {
            Ok(v) => v,
            Err(e) if !required("MSCCLPP_REQUIRE_HIPRTC") => {
                return Completion::ignored_with(mscclpp_conformance::harness::ignore_reason(e));
            }
            Err(e) => panic!("MSCCLPP_REQUIRE_HIPRTC=1 but hipRTC is unusable: {e}"),
        };
        report!(
            "hipRTC {major}.{minor} ({})",
            hiprtc::library_name().unwrap_or("?")
        );
        let mut failures = Vec::new();
        let mut compiled = 0;
        for module in modules() {
            for arch in archs_for(module, HIP_ARCHS) {
                let c = match hiprtc::compile_module(module, arch) {
                    Ok(c) => c,
                    Err(e) => {
                        failures.push(format!("{} for {arch}: {e}", module.name));
                        continue;
                    }
                };
                compiled += 1;
                report!(
                    "compiled {} for {arch} in {:.2} s: {} bytes of code object{}",
                    module.name,
                    c.elapsed.as_secs_f64(),
                    c.code.len(),
                    log_suffix(&c.log)
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
                    let name = k.id.name().as_bytes();
                    if !c.code.windows(name.len()).any(|w| w == name) {
                        failures.push(format!(
                            "{} for {arch}: no kernel {} in the code object",
                            module.name, k.id
                        ));
                    }
                }
            }
        }
        report!(
            "hipRTC: {compiled} compiles ({} modules, {} targets; wide modules: the first)",
            modules().len(),
            HIP_ARCHS.len()
        );
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
        Completion::Completed
    }
}

fn hipcc_compiles_every_module_for_gfx90a_gfx908_or_skipped() -> Completion {
    let must = required("MSCCLPP_REQUIRE_HIPCC");
    match Command::new("hipcc").arg("--version").output() {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let first = text
                .lines()
                .find(|l| l.contains("HIP version"))
                .unwrap_or("");
            report!("hipcc: {first}");
        }
        Ok(out) if !must => {
            return Completion::ignored_with(format!("hipcc --version failed ({})", out.status));
        }
        Err(e) if !must => return Completion::ignored_with(format!("hipcc not found: {e}")),
        other => panic!("MSCCLPP_REQUIRE_HIPCC=1 but hipcc is unusable: {other:?}"),
    }
    let kernels = kernels_dir();
    let out_dir = std::env::temp_dir().join(format!("mscclpp-hipcc-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let mut failures = Vec::new();
    let mut compiled = 0;
    for module in modules() {
        let object = out_dir.join(module.name.replace('/', "_") + ".o");
        if module.name.ends_with("_wide.cu") && !required("MSCCLPP_COMPILE_EVERY_ARCH") {
            // hipRTC compiled it for gfx90a with the same front end (see `archs_for`).
            report!(
                "hipcc {}: left to hipRTC (MSCCLPP_COMPILE_EVERY_ARCH=1 compiles it)",
                module.name
            );
            continue;
        }
        let mut cmd = Command::new("hipcc");
        for arch in HIP_ARCHS {
            cmd.arg(format!("--offload-arch={arch}"));
        }
        // HIP's core.cuh first, then the vendor-neutral device API, then the owners' headers
        // (`collectives/args.cuh`, ...); `.cu` files compile as HIP.
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
            HIP_ARCHS.join("+"),
            start.elapsed().as_secs_f64(),
            if out.status.success() { "ok" } else { "FAILED" }
        );
        if !out.status.success() || has_warning(&stderr) {
            failures.push(format!("hipcc {}: {}\n{stderr}", module.name, out.status));
        } else {
            compiled += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    report!(
        "hipcc: {compiled} of {} modules for {}",
        modules().len(),
        HIP_ARCHS.join("+")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    Completion::Completed
}

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![
        Trial::test(
            "every_device_source_on_disk_is_a_module_and_matches_it",
            || {
                every_device_source_on_disk_is_a_module_and_matches_it();
                Ok(())
            },
        ),
        Trial::ignorable_test(
            "nvrtc_compiles_every_module_for_sm80_sm90_sm100_or_skipped",
            || Ok(nvrtc_compiles_every_module_for_sm80_sm90_sm100_or_skipped()),
        ),
        Trial::ignorable_test(
            "hiprtc_compiles_every_module_for_gfx90a_gfx908_or_skipped",
            || Ok(hiprtc_compiles_every_module_for_gfx90a_gfx908_or_skipped()),
        ),
        Trial::ignorable_test(
            "hipcc_compiles_every_module_for_gfx90a_gfx908_or_skipped",
            || Ok(hipcc_compiles_every_module_for_gfx90a_gfx908_or_skipped()),
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
