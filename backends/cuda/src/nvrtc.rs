//! Run-time compilation of the embedded CUDA sources with NVRTC (`libnvrtc`), opened with
//! `libloading` like the driver: a machine without NVRTC gets [`Error::Unavailable`] naming the
//! libraries tried, never a panic.
//!
//! Headers are handed to `nvrtcCreateProgram` in memory (names and contents), so compiling needs
//! no include path and no CUDA toolkit — the device API is self-contained.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mscclpp_hal::rtc::{self, CompileInputs, Diagnostics, GetErrorStringFn, c_string, log_text};
use mscclpp_hal::{Error, Result};

/// Library names tried, in order.
pub const LIBRARY_NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

type Program = *mut c_void;
type NvrtcResult = c_int;

type VersionFn = unsafe extern "C" fn(major: *mut c_int, minor: *mut c_int) -> NvrtcResult;
type CreateProgramFn = unsafe extern "C" fn(
    prog: *mut Program,
    src: *const c_char,
    name: *const c_char,
    num_headers: c_int,
    headers: *const *const c_char,
    include_names: *const *const c_char,
) -> NvrtcResult;
type DestroyProgramFn = unsafe extern "C" fn(prog: *mut Program) -> NvrtcResult;
type CompileProgramFn = unsafe extern "C" fn(
    prog: Program,
    num_options: c_int,
    options: *const *const c_char,
) -> NvrtcResult;
type SizeFn = rtc::SizeFn<Program>;
type BytesFn = rtc::BytesFn<Program>;

/// The NVRTC entry points we use, resolved from one opened library.
struct Api {
    /// Which library name opened.
    library: &'static str,
    version: VersionFn,
    /// Error strings and checks of the result codes.
    diag: Diagnostics,
    create_program: CreateProgramFn,
    destroy_program: DestroyProgramFn,
    compile_program: CompileProgramFn,
    get_program_log_size: SizeFn,
    get_program_log: BytesFn,
    get_ptx_size: SizeFn,
    get_ptx: BytesFn,
    get_cubin_size: Option<SizeFn>,
    get_cubin: Option<BytesFn>,
    /// Keeps the function pointers above valid; never unloaded.
    _lib: libloading::Library,
}

fn unavailable(reason: String) -> Error {
    Error::unavailable("NVRTC", reason)
}

fn load() -> std::result::Result<Api, String> {
    let mut tried = Vec::new();
    for &name in LIBRARY_NAMES {
        // SAFETY: loading NVRTC runs its initialisers, as in every program that uses it; the
        // name is a plain library name resolved by the dynamic loader.
        let lib = match unsafe { libloading::Library::new(name) } {
            Ok(lib) => lib,
            Err(e) => {
                tried.push(format!("{name}: {}", mscclpp_hal::error::chain(&e)));
                continue;
            }
        };
        macro_rules! sym {
            ($t:ty, $s:literal) => {
                // SAFETY: the type matches the C declaration of this NVRTC function in nvrtc.h
                // (`nvrtcResult` is a C enum, i.e. `int`); the pointer stays valid while `lib`
                // is loaded, and `Api` keeps `lib` for as long as it holds the pointer.
                match unsafe { lib.get::<$t>(concat!($s, "\0").as_bytes()) } {
                    Ok(f) => Some(*f),
                    Err(_) => None,
                }
            };
        }
        macro_rules! required {
            ($t:ty, $s:literal) => {
                match sym!($t, $s) {
                    Some(f) => f,
                    None => {
                        tried.push(format!("{name}: opened but lacks {}", $s));
                        continue;
                    }
                }
            };
        }
        let api = Api {
            library: name,
            version: required!(VersionFn, "nvrtcVersion"),
            diag: Diagnostics {
                backend: "cuda",
                compiler: "NVRTC",
                get_error_string: required!(GetErrorStringFn, "nvrtcGetErrorString"),
            },
            create_program: required!(CreateProgramFn, "nvrtcCreateProgram"),
            destroy_program: required!(DestroyProgramFn, "nvrtcDestroyProgram"),
            compile_program: required!(CompileProgramFn, "nvrtcCompileProgram"),
            get_program_log_size: required!(SizeFn, "nvrtcGetProgramLogSize"),
            get_program_log: required!(BytesFn, "nvrtcGetProgramLog"),
            get_ptx_size: required!(SizeFn, "nvrtcGetPTXSize"),
            get_ptx: required!(BytesFn, "nvrtcGetPTX"),
            get_cubin_size: sym!(SizeFn, "nvrtcGetCUBINSize"),
            get_cubin: sym!(BytesFn, "nvrtcGetCUBIN"),
            _lib: lib,
        };
        return Ok(api);
    }
    Err(format!(
        "the NVRTC library could not be opened (tried {}); install the CUDA toolkit's NVRTC or the \
         `nvidia-cuda-nvrtc` wheel and put its lib directory on LD_LIBRARY_PATH",
        tried.join("; ")
    ))
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|reason| unavailable(reason.clone()))
}

/// The version of the NVRTC library that compiles, e.g. `(13, 0)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    let api = api()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out-pointers to locals.
    let code = unsafe { (api.version)(&mut major, &mut minor) };
    api.diag.check("nvrtcVersion", code, "version query")?;
    Ok((major, minor))
}

/// Which library file NVRTC was opened from (for logs and cache keys).
pub fn library_name() -> Result<&'static str> {
    Ok(api()?.library)
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

/// Destroys a program when dropped.
struct ProgramGuard<'a> {
    api: &'a Api,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` was created by `nvrtcCreateProgram` of this library and is destroyed
        // once, here.
        unsafe { (self.api.destroy_program)(&mut self.prog) };
    }
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
    let api = api()?;
    let context = format!("{source_name} for {arch}");
    let inputs = CompileInputs::new(source_name, source, headers)?;

    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: every pointer is to a NUL-terminated string alive for the call; the two arrays
    // hold `num_headers` entries each; `prog` is a valid out-pointer. NVRTC copies the strings.
    let code = unsafe {
        (api.create_program)(
            &mut prog,
            inputs.source(),
            inputs.name(),
            inputs.num_headers(),
            inputs.headers(),
            inputs.include_names(),
        )
    };
    api.diag.check("nvrtcCreateProgram", code, &context)?;
    let guard = ProgramGuard { api, prog };

    let mut options = vec![
        c_string("architecture", &format!("--gpu-architecture={arch}"))?,
        c_string("option", crate::module::COMPILE_OPTIONS)?,
    ];
    for extra in crate::module::extra_compile_options() {
        options.push(c_string("option from MSCCLPP_NVRTC_OPTIONS", &extra)?);
    }
    let option_ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();
    let start = Instant::now();
    // SAFETY: `guard.prog` is live; `option_ptrs` holds `options.len()` NUL-terminated strings.
    let code = unsafe {
        (api.compile_program)(guard.prog, option_ptrs.len() as c_int, option_ptrs.as_ptr())
    };
    let elapsed = start.elapsed();
    // SAFETY: `guard.prog` is live; the size/bytes pair is NVRTC's log accessor.
    let log = unsafe {
        api.diag.read_output(
            guard.prog,
            api.get_program_log_size,
            api.get_program_log,
            ("nvrtcGetProgramLogSize", "nvrtcGetProgramLog"),
            &context,
        )
    }?;
    let log = log_text(&log);
    if code != 0 {
        return Err(Error::Driver {
            backend: "cuda",
            call: "nvrtcCompileProgram",
            code: i64::from(code),
            message: format!(
                "{} compiling {context}:\n{log}",
                api.diag.error_string(code)
            ),
        });
    }
    // SAFETY: as above, NVRTC's PTX accessor pair.
    let ptx = unsafe {
        api.diag.read_output(
            guard.prog,
            api.get_ptx_size,
            api.get_ptx,
            ("nvrtcGetPTXSize", "nvrtcGetPTX"),
            &context,
        )
    }?;
    let cubin = match (api.get_cubin_size, api.get_cubin, arch.starts_with("sm_")) {
        (Some(size_fn), Some(bytes_fn), true) => {
            // SAFETY: as above, NVRTC's cubin accessor pair.
            let c = unsafe {
                api.diag.read_output(
                    guard.prog,
                    size_fn,
                    bytes_fn,
                    ("nvrtcGetCUBINSize", "nvrtcGetCUBIN"),
                    &context,
                )
            }?;
            (!c.is_empty()).then_some(c)
        }
        _ => None,
    };
    drop(guard);
    Ok(Compiled {
        ptx,
        cubin,
        log,
        elapsed,
    })
}
