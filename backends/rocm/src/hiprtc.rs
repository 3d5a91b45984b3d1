//! Run-time compilation of the embedded HIP sources with hipRTC, opened with `libloading` like
//! the runtime: a machine without hipRTC gets [`Error::Unavailable`] naming the libraries tried,
//! never a panic.
//!
//! hipRTC is `libhiprtc.so` from ROCm 5.3 on; up to ROCm 5.2 (Debian 12's packages) its entry
//! points live in `libamdhip64.so` itself, which is therefore tried after it. Headers are handed
//! to `hiprtcCreateProgram` in memory, so compiling needs no include path and no ROCm headers:
//! hipRTC declares the HIP device runtime implicitly and the device API is self-contained.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mscclpp_hal::rtc::{self, CompileInputs, Diagnostics, GetErrorStringFn, c_string, log_text};
use mscclpp_hal::{Error, Result};

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

type Program = *mut c_void;
type HiprtcResult = c_int;

type VersionFn = unsafe extern "C" fn(major: *mut c_int, minor: *mut c_int) -> HiprtcResult;
type CreateProgramFn = unsafe extern "C" fn(
    prog: *mut Program,
    src: *const c_char,
    name: *const c_char,
    num_headers: c_int,
    headers: *const *const c_char,
    include_names: *const *const c_char,
) -> HiprtcResult;
type DestroyProgramFn = unsafe extern "C" fn(prog: *mut Program) -> HiprtcResult;
type CompileProgramFn = unsafe extern "C" fn(
    prog: Program,
    num_options: c_int,
    options: *const *const c_char,
) -> HiprtcResult;
type SizeFn = rtc::SizeFn<Program>;
type BytesFn = rtc::BytesFn<Program>;

/// The hipRTC entry points we use, resolved from one opened library.
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
    get_code_size: SizeFn,
    get_code: BytesFn,
    /// Keeps the function pointers above valid; never unloaded.
    _lib: libloading::Library,
}

fn unavailable(reason: String) -> Error {
    Error::unavailable("hipRTC", reason)
}

fn load() -> std::result::Result<Api, String> {
    let mut tried = Vec::new();
    for &name in LIBRARY_NAMES {
        // SAFETY: loading hipRTC (or the HIP runtime that holds it) runs its initialisers, as in
        // every program that uses it; the name is resolved by the dynamic loader.
        let lib = match unsafe { libloading::Library::new(name) } {
            Ok(lib) => lib,
            Err(e) => {
                tried.push(format!("{name}: {}", mscclpp_hal::error::chain(&e)));
                continue;
            }
        };
        macro_rules! sym {
            ($t:ty, $s:literal) => {
                // SAFETY: the type matches the C declaration of this hipRTC function in
                // hiprtc.h (`hiprtcResult` is a C enum, i.e. `int`; `hiprtcProgram` a pointer);
                // the pointer stays valid while `lib` is loaded, and `Api` keeps `lib` for as
                // long as it holds the pointer.
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
            version: required!(VersionFn, "hiprtcVersion"),
            diag: Diagnostics {
                backend: "rocm",
                compiler: "hipRTC",
                get_error_string: required!(GetErrorStringFn, "hiprtcGetErrorString"),
            },
            create_program: required!(CreateProgramFn, "hiprtcCreateProgram"),
            destroy_program: required!(DestroyProgramFn, "hiprtcDestroyProgram"),
            compile_program: required!(CompileProgramFn, "hiprtcCompileProgram"),
            get_program_log_size: required!(SizeFn, "hiprtcGetProgramLogSize"),
            get_program_log: required!(BytesFn, "hiprtcGetProgramLog"),
            get_code_size: required!(SizeFn, "hiprtcGetCodeSize"),
            get_code: required!(BytesFn, "hiprtcGetCode"),
            _lib: lib,
        };
        return Ok(api);
    }
    Err(format!(
        "no library with hipRTC could be opened (tried {}); install ROCm's hipRTC (Debian: \
         libamdhip64-5 and libhiprtc-builtins5)",
        tried.join("; ")
    ))
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|reason| unavailable(reason.clone()))
}

/// The version of the hipRTC library that compiles, e.g. `(5, 2)`.
pub fn hiprtc_version() -> Result<(i32, i32)> {
    let api = api()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out-pointers to locals.
    let code = unsafe { (api.version)(&mut major, &mut minor) };
    api.diag.check("hiprtcVersion", code, "version query")?;
    Ok((major, minor))
}

/// Which library file hipRTC was opened from (for logs and cache keys).
pub fn library_name() -> Result<&'static str> {
    Ok(api()?.library)
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

/// Destroys a program when dropped.
struct ProgramGuard<'a> {
    api: &'a Api,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` was created by `hiprtcCreateProgram` of this library and is destroyed
        // once, here.
        unsafe { (self.api.destroy_program)(&mut self.prog) };
    }
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
    let api = api()?;
    refuse_known_crash(api.library, arch)?;
    let context = format!("{source_name} for {arch}");
    let inputs = CompileInputs::new(source_name, source, headers)?;

    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: every pointer is to a NUL-terminated string alive for the call; the two arrays
    // hold `num_headers` entries each; `prog` is a valid out-pointer. hipRTC copies the strings.
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
    api.diag.check("hiprtcCreateProgram", code, &context)?;
    let guard = ProgramGuard { api, prog };

    let options = [
        c_string("architecture", &format!("--offload-arch={arch}"))?,
        c_string("option", "-std=c++17")?,
    ];
    let option_ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();
    let start = Instant::now();
    // SAFETY: `guard.prog` is live; `option_ptrs` holds `options.len()` NUL-terminated strings.
    let code = unsafe {
        (api.compile_program)(guard.prog, option_ptrs.len() as c_int, option_ptrs.as_ptr())
    };
    let elapsed = start.elapsed();
    // SAFETY: `guard.prog` is live; the size/bytes pair is hipRTC's log accessor.
    let log = unsafe {
        api.diag.read_output(
            guard.prog,
            api.get_program_log_size,
            api.get_program_log,
            ("hiprtcGetProgramLogSize", "hiprtcGetProgramLog"),
            &context,
        )
    }?;
    let log = log_text(&log);
    if code != 0 {
        return Err(Error::Driver {
            backend: "rocm",
            call: "hiprtcCompileProgram",
            code: i64::from(code),
            message: format!(
                "{} compiling {context}:\n{log}",
                api.diag.error_string(code)
            ),
        });
    }
    // SAFETY: as above, hipRTC's code-object accessor pair.
    let code = unsafe {
        api.diag.read_output(
            guard.prog,
            api.get_code_size,
            api.get_code,
            ("hiprtcGetCodeSize", "hiprtcGetCode"),
            &context,
        )
    }?;
    drop(guard);
    if code.is_empty() {
        return Err(Error::Driver {
            backend: "rocm",
            call: "hiprtcGetCode",
            code: 0,
            message: format!("hipRTC returned an empty code object for {context}:\n{log}"),
        });
    }
    Ok(Compiled { code, log, elapsed })
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
