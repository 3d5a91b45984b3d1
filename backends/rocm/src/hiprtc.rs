//! hipRTC: its library names and symbols for [`mscclpp_gpu::rtc`], which opens it with
//! `libloading` like the runtime (a machine without hipRTC gets [`Error::Unavailable`] naming
//! the libraries tried, never a panic) and runs the compile.
//!
//! hipRTC is `libhiprtc.so` from ROCm 5.3 on; up to ROCm 5.2 (Debian 12's packages) its entry
//! points live in `libamdhip64.so` itself, which is therefore tried after it. Headers are handed
//! to `hiprtcCreateProgram` in memory, so compiling needs no include path and no ROCm headers:
//! hipRTC declares the HIP device runtime implicitly and the device API is self-contained.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use mscclpp_gpu::device_api::{HIP_CORE, module_headers};
use mscclpp_gpu::rtc::{OutputSymbols, RtcLibrary, RtcSymbols};
use mscclpp_hal::{Error, KernelModule, Result};

/// Library names tried, in order.
pub const LIBRARY_NAMES: &[&str] = &[
    "libhiprtc.so.6",
    "libhiprtc.so.5",
    "libhiprtc.so",
    "/opt/rocm/lib/libhiprtc.so",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
];

/// The options every module is compiled with (besides the target); part of the key.
pub const COMPILE_OPTIONS: &str = "-std=c++17";

static SYMBOLS: RtcSymbols = RtcSymbols {
    backend: "rocm",
    compiler: "hipRTC",
    version: "hiprtcVersion",
    get_error_string: "hiprtcGetErrorString",
    create_program: "hiprtcCreateProgram",
    destroy_program: "hiprtcDestroyProgram",
    compile_program: "hiprtcCompileProgram",
    log: OutputSymbols {
        size: "hiprtcGetProgramLogSize",
        bytes: "hiprtcGetProgramLog",
        required: true,
    },
    outputs: &[OutputSymbols {
        size: "hiprtcGetCodeSize",
        bytes: "hiprtcGetCode",
        required: true,
    }],
};

fn unavailable(reason: String) -> Error {
    Error::unavailable("hipRTC", reason)
}

fn library() -> Result<&'static RtcLibrary> {
    static LIB: OnceLock<std::result::Result<RtcLibrary, String>> = OnceLock::new();
    LIB.get_or_init(|| RtcLibrary::open_first(LIBRARY_NAMES, &SYMBOLS))
        .as_ref()
        .map_err(|tried| {
            unavailable(format!(
                "no library with hipRTC could be opened (tried {tried}); install ROCm's hipRTC \
                 (Debian: libamdhip64-5 and libhiprtc-builtins5)"
            ))
        })
}

/// The version of the hipRTC library that compiles, e.g. `(5, 2)`.
pub fn hiprtc_version() -> Result<(i32, i32)> {
    library()?.version()
}

/// Which library file hipRTC was opened from (for logs).
pub fn library_name() -> Result<&'static str> {
    Ok(library()?.library)
}

/// What a successful compile produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The code object (an ELF for `hipModuleLoadData`).
    pub code: Vec<u8>,
    /// hipRTC's log (warnings); empty when it had nothing to say.
    pub log: String,
    /// How long `hiprtcCompileProgram` took.
    pub elapsed: Duration,
}

/// MI300-family processors (`gfx940`, `gfx941`, `gfx942`).
const MI300_PROCESSORS: &[&str] = &["gfx940", "gfx941", "gfx942"];

/// Refuses what is known to kill the process instead of failing: the hipRTC inside ROCm 5.2's
/// `libamdhip64.so.5` (Debian 12's; clang 15) aborts in `hiprtcCompileProgram`
/// (`munmap_chunk(): invalid pointer`, SIGABRT) when asked for an MI300 processor — gfx940,
/// which its clang knows, as well as gfx941/gfx942, which it does not. A standalone libhiprtc
/// (ROCm 5.3+) is tried first and is not affected by this check.
pub fn refuse_known_crash(library: &str, arch: &str) -> Result<()> {
    let processor = arch.split(':').next().unwrap_or(arch);
    if library.starts_with("libamdhip64") && MI300_PROCESSORS.contains(&processor) {
        return Err(unavailable(format!(
            "the hipRTC inside {library} (ROCm 5.2 or older) aborts the process when compiling for \
             {processor}; install ROCm 6 (libhiprtc.so.6) to compile for MI300-family GPUs"
        )));
    }
    Ok(())
}

/// Compiles `source` (named `source_name` in messages) for `arch` (`"gfx90a"`), with `headers`
/// given as `(include name, contents)` pairs that `#include`s resolve to. A compile error is an
/// [`Error::Driver`] whose message holds hipRTC's log.
pub fn compile(
    source_name: &str,
    source: &str,
    headers: &[(&str, &str)],
    arch: &str,
) -> Result<Compiled> {
    let lib = library()?;
    refuse_known_crash(lib.library, arch)?;
    let context = format!("{source_name} for {arch}");
    let options = [format!("--offload-arch={arch}"), COMPILE_OPTIONS.to_owned()];
    // One compile at a time: the hipRTC inside ROCm 5.2's libamdhip64 is not thread-safe — two
    // threads compiling at once crashed the process (SIGSEGV) in 11 of 12 runs of the compile
    // tests, and two devices of one process may load modules at the same time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = lib.compile((source_name, source), headers, &options, |_| true, &context);
    drop(guard);
    let mut out = out?;
    let code = out
        .outputs
        .first_mut()
        .and_then(Option::take)
        .unwrap_or_default();
    if code.is_empty() {
        return Err(Error::Driver {
            backend: "rocm",
            call: "hiprtcGetCode",
            code: 0,
            message: format!(
                "hipRTC returned an empty code object for {context}:\n{}",
                out.log
            ),
        });
    }
    Ok(Compiled {
        code,
        log: out.log,
        elapsed: out.elapsed,
    })
}

/// Compiles `module` for `arch` ("gfx90a") exactly as the backend does at run time — its source
/// with the device API, this vendor's `core.cuh` and the module's own headers — with no device
/// needed: what the kernel compile tests drive for every module the library owns.
pub fn compile_module(module: &KernelModule, arch: &str) -> Result<Compiled> {
    compile(
        module.name,
        module.source,
        &module_headers(HIP_CORE, module),
        arch,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mi300_targets_are_refused_only_for_the_runtime_embedded_hiprtc() {
        for arch in ["gfx940", "gfx942", "gfx942:sramecc+:xnack-", "gfx941"] {
            let e = refuse_known_crash("libamdhip64.so.5", arch).unwrap_err();
            assert_eq!(e.class(), mscclpp_hal::ErrorClass::Unavailable, "{e}");
            assert!(e.to_string().contains("ROCm 6"), "{e}");
            assert!(refuse_known_crash("libhiprtc.so.6", arch).is_ok());
        }
        assert!(refuse_known_crash("libamdhip64.so.5", "gfx90a").is_ok());
        assert!(refuse_known_crash("libamdhip64.so.5", "gfx9420").is_ok());
    }
}
