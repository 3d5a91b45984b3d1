//! NVRTC (`libnvrtc`): its library names and symbols for [`mscclpp_gpu::rtc`], which opens it
//! with `libloading` like the driver (a machine without NVRTC gets [`Error::Unavailable`] naming
//! the libraries tried, never a panic) and runs the compile.
//!
//! Headers are handed to `nvrtcCreateProgram` in memory (names and contents), so compiling needs
//! no include path and no CUDA toolkit — the device API is self-contained.

use std::sync::OnceLock;
use std::time::Duration;

use mscclpp_gpu::device_api::{CUDA_CORE, module_headers};
use mscclpp_gpu::rtc::{OutputSymbols, RtcLibrary, RtcSymbols};
use mscclpp_hal::{Error, KernelModule, Result};

/// Library names tried, in order.
pub const LIBRARY_NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// The options every module is compiled with (besides the architecture); part of the key.
pub const COMPILE_OPTIONS: &str = "-std=c++17";

static SYMBOLS: RtcSymbols = RtcSymbols {
    backend: "cuda",
    compiler: "NVRTC",
    version: "nvrtcVersion",
    get_error_string: "nvrtcGetErrorString",
    create_program: "nvrtcCreateProgram",
    destroy_program: "nvrtcDestroyProgram",
    compile_program: "nvrtcCompileProgram",
    log: OutputSymbols {
        size: "nvrtcGetProgramLogSize",
        bytes: "nvrtcGetProgramLog",
        required: true,
    },
    outputs: &[
        OutputSymbols {
            size: "nvrtcGetPTXSize",
            bytes: "nvrtcGetPTX",
            required: true,
        },
        OutputSymbols {
            size: "nvrtcGetCUBINSize",
            bytes: "nvrtcGetCUBIN",
            required: false,
        },
    ],
};
const PTX: usize = 0;
const CUBIN: usize = 1;

fn library() -> Result<&'static RtcLibrary> {
    static LIB: OnceLock<std::result::Result<RtcLibrary, String>> = OnceLock::new();
    LIB.get_or_init(|| RtcLibrary::open_first(LIBRARY_NAMES, &SYMBOLS))
        .as_ref()
        .map_err(|tried| {
            Error::unavailable(
                "NVRTC",
                format!(
                    "the NVRTC library could not be opened (tried {tried}); install the CUDA \
                     toolkit's NVRTC or the `nvidia-cuda-nvrtc` wheel and put its lib directory \
                     on LD_LIBRARY_PATH"
                ),
            )
        })
}

/// Extra NVRTC options from `MSCCLPP_NVRTC_OPTIONS` (whitespace-separated; for developers, e.g.
/// `--ptxas-options=-v` to see register and stack use in the compile log); part of the key.
pub fn extra_compile_options() -> Vec<String> {
    std::env::var("MSCCLPP_NVRTC_OPTIONS")
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// [`COMPILE_OPTIONS`] and [`extra_compile_options`].
pub fn options() -> Vec<String> {
    std::iter::once(COMPILE_OPTIONS.to_owned())
        .chain(extra_compile_options())
        .collect()
}

/// The version of the NVRTC library that compiles, e.g. `(13, 0)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    library()?.version()
}

/// Which library file NVRTC was opened from (for logs).
pub fn library_name() -> Result<&'static str> {
    Ok(library()?.library)
}

/// What a successful compile produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The PTX text (NUL-terminated, as NVRTC returns it).
    pub ptx: Vec<u8>,
    /// The cubin, when the architecture is a real one (`sm_XY`) and NVRTC offers cubins.
    pub cubin: Option<Vec<u8>>,
    /// NVRTC's log (warnings); empty when it had nothing to say.
    pub log: String,
    /// How long `nvrtcCompileProgram` took.
    pub elapsed: Duration,
}

/// Compiles `source` (named `source_name` in messages) for `arch` (`"sm_90"`, or a virtual
/// `"compute_90"`), with `headers` given as `(include name, contents)` pairs that `#include`s
/// resolve to. A compile error is an [`Error::Driver`] whose message holds NVRTC's log.
pub fn compile(
    source_name: &str,
    source: &str,
    headers: &[(&str, &str)],
    arch: &str,
) -> Result<Compiled> {
    let lib = library()?;
    let mut opts = vec![format!("--gpu-architecture={arch}")];
    opts.extend(options());
    // Only a real architecture has a cubin.
    let want = |i: usize| i == PTX || arch.starts_with("sm_");
    let context = format!("{source_name} for {arch}");
    let mut out = lib.compile((source_name, source), headers, &opts, want, &context)?;
    let cubin = out.outputs.get_mut(CUBIN).and_then(Option::take);
    let ptx = out
        .outputs
        .get_mut(PTX)
        .and_then(Option::take)
        .unwrap_or_default();
    Ok(Compiled {
        ptx,
        cubin: cubin.filter(|c| !c.is_empty()),
        log: out.log,
        elapsed: out.elapsed,
    })
}
/// Compiles `module` for `arch` ("sm_90") exactly as the backend does at run time — its source
/// with the device API, this vendor's `core.cuh` and the module's own headers — with no device
/// needed: what the kernel compile tests drive for every module the library owns.
pub fn compile_module(module: &KernelModule, arch: &str) -> Result<Compiled> {
    compile(
        module.name,
        module.source,
        &module_headers(CUDA_CORE, module),
        arch,
    )
}
