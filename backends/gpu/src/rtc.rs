//! Run-time compilation, written once for NVRTC and hipRTC: both have the same C shape (a
//! program created from a source and in-memory headers, compiled with options, a log and outputs
//! read as size-then-bytes, `int` result codes with an error-string call). A vendor gives the
//! library names and its symbol names ([`RtcSymbols`]); [`RtcLibrary`] opens the first library
//! that has them (a machine without one gets `Unavailable` naming the libraries tried, never a
//! panic) and runs the compile.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, Result};

/// `<compiler>GetErrorString(result)`.
pub type GetErrorStringFn = unsafe extern "C" fn(result: c_int) -> *const c_char;
/// `<compiler>Get<Output>Size(prog, &size)`.
pub type SizeFn<P> = unsafe extern "C" fn(prog: P, size: *mut usize) -> c_int;
/// `<compiler>Get<Output>(prog, buffer)`.
pub type BytesFn<P> = unsafe extern "C" fn(prog: P, out: *mut c_char) -> c_int;

/// A NUL-terminated copy of `s`, or an error naming `what` when it holds a NUL byte.
pub fn c_string(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(format!("{what} contains a NUL byte")))
}

/// The C strings of one compile: the source, its name, and the headers (include names and
/// contents) that `#include`s resolve to, with the pointer arrays the compilers take.
#[derive(Debug)]
pub struct CompileInputs {
    source: CString,
    name: CString,
    /// Owns the strings behind `header_ptrs` (a `CString`'s bytes do not move with it).
    _headers: Vec<CString>,
    /// Owns the strings behind `name_ptrs`.
    _names: Vec<CString>,
    header_ptrs: Vec<*const c_char>,
    name_ptrs: Vec<*const c_char>,
    num_headers: c_int,
}

impl CompileInputs {
    /// Converts `source` (named `source_name`) and `headers` (`(include name, contents)`).
    pub fn new(source_name: &str, source: &str, headers: &[(&str, &str)]) -> Result<Self> {
        let source = c_string("kernel source", source)?;
        let name = c_string("kernel source name", source_name)?;
        let mut c_headers = Vec::with_capacity(headers.len());
        let mut c_names = Vec::with_capacity(headers.len());
        for (name, contents) in headers {
            c_names.push(c_string("header name", name)?);
            c_headers.push(c_string(&format!("header {name}"), contents)?);
        }
        let num_headers = c_int::try_from(headers.len())
            .map_err(|_| Error::invalid(format!("{} headers is too many", headers.len())))?;
        Ok(CompileInputs {
            source,
            name,
            header_ptrs: c_headers.iter().map(|c| c.as_ptr()).collect(),
            name_ptrs: c_names.iter().map(|c| c.as_ptr()).collect(),
            _headers: c_headers,
            _names: c_names,
            num_headers,
        })
    }
    /// The source text, NUL-terminated.
    pub fn source(&self) -> *const c_char {
        self.source.as_ptr()
    }
    /// The source's name, NUL-terminated.
    pub fn name(&self) -> *const c_char {
        self.name.as_ptr()
    }
    /// How many headers the two arrays hold.
    pub fn num_headers(&self) -> c_int {
        self.num_headers
    }
    /// `num_headers` pointers to the headers' contents, NUL-terminated.
    pub fn headers(&self) -> *const *const c_char {
        self.header_ptrs.as_ptr()
    }
    /// `num_headers` pointers to the headers' include names, NUL-terminated.
    pub fn include_names(&self) -> *const *const c_char {
        self.name_ptrs.as_ptr()
    }
}

/// The text of a compile log as the compilers return it (NUL-terminated, maybe padded):
/// trimmed, empty when the compiler had nothing to say.
pub fn log_text(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .trim_end_matches('\0')
        .trim()
        .to_owned()
}

/// Error strings and checks of one compiler's result codes (0 is success).
#[derive(Debug, Clone, Copy)]
pub struct Diagnostics {
    /// The backend named in [`Error::Driver`] (`"cuda"`).
    pub backend: &'static str,
    /// The compiler, for codes it has no string for (`"NVRTC"`).
    pub compiler: &'static str,
    /// The compiler's `GetErrorString`.
    pub get_error_string: GetErrorStringFn,
}

impl Diagnostics {
    /// The compiler's description of `code`.
    pub fn error_string(&self, code: c_int) -> String {
        // SAFETY: the compilers' GetErrorString accepts any value and returns a pointer to a
        // static, NUL-terminated string (or null for values it does not know); the backend
        // resolved `get_error_string` with that C declaration.
        let p = unsafe { (self.get_error_string)(code) };
        if p.is_null() {
            format!("{} error {code}", self.compiler)
        } else {
            // SAFETY: non-null, NUL-terminated, static (see above).
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }

    /// `Ok` for 0, else an [`Error::Driver`] naming `call` and `context`.
    pub fn check(&self, call: &'static str, code: c_int, context: &str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        Err(Error::Driver {
            backend: self.backend,
            call,
            code: i64::from(code),
            message: format!("{} ({context})", self.error_string(code)),
        })
    }

    /// Reads a size-then-bytes output of `prog` (`what`: the two calls' names).
    ///
    /// # Safety
    /// `prog` must be a live program of the compiler for which `size_fn`/`bytes_fn` are valid.
    pub unsafe fn read_output<P: Copy>(
        &self,
        prog: P,
        size_fn: SizeFn<P>,
        bytes_fn: BytesFn<P>,
        what: (&'static str, &'static str),
        context: &str,
    ) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: `prog` is live (caller's contract); `size` is a valid out-pointer.
        self.check(what.0, unsafe { size_fn(prog, &mut size) }, context)?;
        let mut buf = vec![0u8; size];
        if size > 0 {
            // SAFETY: `buf` has exactly the `size` bytes the compiler said it will write.
            let code = unsafe { bytes_fn(prog, buf.as_mut_ptr().cast()) };
            self.check(what.1, code, context)?;
        }
        Ok(buf)
    }
}

/// A compiler's program handle.
pub type Program = *mut c_void;
type VersionFn = unsafe extern "C" fn(major: *mut c_int, minor: *mut c_int) -> c_int;
type CreateProgramFn = unsafe extern "C" fn(
    prog: *mut Program,
    src: *const c_char,
    name: *const c_char,
    num_headers: c_int,
    headers: *const *const c_char,
    include_names: *const *const c_char,
) -> c_int;
type DestroyProgramFn = unsafe extern "C" fn(prog: *mut Program) -> c_int;
type CompileProgramFn =
    unsafe extern "C" fn(prog: Program, num_options: c_int, options: *const *const c_char) -> c_int;

/// A size-then-bytes output of a compiled program (`nvrtcGetPTXSize` / `nvrtcGetPTX`).
#[derive(Debug, Clone, Copy)]
pub struct OutputSymbols {
    /// The size call.
    pub size: &'static str,
    /// The bytes call.
    pub bytes: &'static str,
    /// Whether a library without it is unusable (else the output is simply absent).
    pub required: bool,
}

/// The symbol names of one compiler (the C signatures are the same for NVRTC and hipRTC).
#[derive(Debug, Clone, Copy)]
pub struct RtcSymbols {
    /// The backend named in errors (`"cuda"`).
    pub backend: &'static str,
    /// The compiler in messages (`"NVRTC"`).
    pub compiler: &'static str,
    /// `<c>Version(int*, int*)`.
    pub version: &'static str,
    /// `<c>GetErrorString(result)`.
    pub get_error_string: &'static str,
    /// `<c>CreateProgram`.
    pub create_program: &'static str,
    /// `<c>DestroyProgram`.
    pub destroy_program: &'static str,
    /// `<c>CompileProgram`.
    pub compile_program: &'static str,
    /// The log.
    pub log: OutputSymbols,
    /// The compiled outputs, in the order [`RtcOutput::outputs`] returns them.
    pub outputs: &'static [OutputSymbols],
}

/// One opened run-time compiler.
#[derive(Debug)]
pub struct RtcLibrary {
    /// Which library name opened.
    pub library: &'static str,
    symbols: &'static RtcSymbols,
    version: VersionFn,
    /// Error strings and checks of the result codes.
    pub diag: Diagnostics,
    create_program: CreateProgramFn,
    destroy_program: DestroyProgramFn,
    compile_program: CompileProgramFn,
    log: (SizeFn<Program>, BytesFn<Program>),
    outputs: Vec<Option<(SizeFn<Program>, BytesFn<Program>)>>,
    /// Keeps the function pointers above valid; never unloaded.
    _lib: libloading::Library,
}

/// What a successful compile produced.
#[derive(Debug, Clone)]
pub struct RtcOutput {
    /// Each of [`RtcSymbols::outputs`]: `None` where the library lacks it or it was not wanted.
    pub outputs: Vec<Option<Vec<u8>>>,
    /// The compiler's log (warnings); empty when it had nothing to say.
    pub log: String,
    /// How long the compile call took.
    pub elapsed: Duration,
}

/// Destroys a program when dropped.
struct ProgramGuard<'a> {
    lib: &'a RtcLibrary,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` was created by this library's CreateProgram and is destroyed once.
        unsafe { (self.lib.destroy_program)(&mut self.prog) };
    }
}

impl RtcLibrary {
    /// Opens the first of `names` that has every required symbol of `symbols`; the error names
    /// what each candidate lacked.
    pub fn open_first(
        names: &[&'static str],
        symbols: &'static RtcSymbols,
    ) -> std::result::Result<Self, String> {
        let mut tried = Vec::new();
        for &name in names {
            match Self::open(name, symbols) {
                Ok(lib) => return Ok(lib),
                Err(e) => {
                    // The loader's message repeats the search path; the error names the
                    // libraries only and the debug log says why each failed.
                    tracing::debug!(library = name, "no run-time compiler: {e}");
                    tried.push(if e.starts_with("opened but") {
                        format!("{name} ({e})")
                    } else {
                        name.to_owned()
                    });
                }
            }
        }
        Err(format!(
            "{}; MSCCLPP_LOG_LEVEL=debug says why",
            tried.join(", ")
        ))
    }

    fn open(name: &'static str, symbols: &'static RtcSymbols) -> std::result::Result<Self, String> {
        // SAFETY: loading the compiler runs its initialisers, as in every program that uses it;
        // the name is resolved by the dynamic loader.
        let lib =
            unsafe { libloading::Library::new(name) }.map_err(|e| mscclpp_hal::error::chain(&e))?;
        /// Looks up `symbol` as a `T`.
        ///
        /// # Safety
        /// `T` is the C signature of `symbol` (the compilers' shapes above: `int` results, a
        /// pointer program handle); the pointer is used only while `lib` is loaded.
        unsafe fn get<T: Copy>(lib: &libloading::Library, symbol: &str) -> Option<T> {
            // SAFETY: forwarded contract.
            unsafe { lib.get::<T>(symbol.as_bytes()) }.ok().map(|f| *f)
        }
        let required = |symbol: &str| format!("opened but lacks {symbol}");
        // SAFETY (every `get` below): the types are the C declarations of these functions in
        // nvrtc.h / hiprtc.h, which agree; `RtcLibrary` keeps `lib` for as long as it holds
        // the pointers.
        let output = |o: &OutputSymbols| -> std::result::Result<_, String> {
            // SAFETY: see above.
            let pair = unsafe { get(&lib, o.size).zip(get(&lib, o.bytes)) };
            match pair {
                None if o.required => Err(required(o.size)),
                pair => Ok(pair),
            }
        };
        let log = output(&symbols.log)?.ok_or_else(|| required(symbols.log.size))?;
        let outputs = symbols
            .outputs
            .iter()
            .map(output)
            .collect::<std::result::Result<Vec<_>, _>>()?;
        // SAFETY: see above.
        let (version, get_error_string, create_program, destroy_program, compile_program) = unsafe {
            (
                get::<VersionFn>(&lib, symbols.version).ok_or_else(|| required(symbols.version))?,
                get::<GetErrorStringFn>(&lib, symbols.get_error_string)
                    .ok_or_else(|| required(symbols.get_error_string))?,
                get::<CreateProgramFn>(&lib, symbols.create_program)
                    .ok_or_else(|| required(symbols.create_program))?,
                get::<DestroyProgramFn>(&lib, symbols.destroy_program)
                    .ok_or_else(|| required(symbols.destroy_program))?,
                get::<CompileProgramFn>(&lib, symbols.compile_program)
                    .ok_or_else(|| required(symbols.compile_program))?,
            )
        };
        Ok(RtcLibrary {
            library: name,
            symbols,
            version,
            diag: Diagnostics {
                backend: symbols.backend,
                compiler: symbols.compiler,
                get_error_string,
            },
            create_program,
            destroy_program,
            compile_program,
            log,
            outputs,
            _lib: lib,
        })
    }

    /// The compiler's version, e.g. `(13, 0)`.
    pub fn version(&self) -> Result<(i32, i32)> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers to locals.
        let code = unsafe { (self.version)(&mut major, &mut minor) };
        self.diag
            .check(self.symbols.version, code, "version query")?;
        Ok((major, minor))
    }

    /// Compiles `source` (named `source_name` in messages) with `headers` given as `(include
    /// name, contents)` pairs that `#include`s resolve to, and `options`; reads the outputs
    /// `want` selects (by index in [`RtcSymbols::outputs`]). A compile error is an
    /// [`Error::Driver`] whose message holds the compiler's log; `context` names the compile.
    pub fn compile(
        &self,
        (source_name, source): (&str, &str),
        headers: &[(&str, &str)],
        options: &[String],
        want: impl Fn(usize) -> bool,
        context: &str,
    ) -> Result<RtcOutput> {
        let sym = self.symbols;
        let inputs = CompileInputs::new(source_name, source, headers)?;
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: every pointer is to a NUL-terminated string alive for the call; the two
        // arrays hold `num_headers` entries each; `prog` is a valid out-pointer. The compiler
        // copies the strings.
        let code = unsafe {
            (self.create_program)(
                &mut prog,
                inputs.source(),
                inputs.name(),
                inputs.num_headers(),
                inputs.headers(),
                inputs.include_names(),
            )
        };
        self.diag.check(sym.create_program, code, context)?;
        let guard = ProgramGuard { lib: self, prog };
        let options = options
            .iter()
            .map(|o| c_string("compile option", o))
            .collect::<Result<Vec<_>>>()?;
        let option_ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();
        let count = c_int::try_from(option_ptrs.len()).map_err(|_| {
            Error::invalid(format!("{} compile options is too many", options.len()))
        })?;
        let start = Instant::now();
        // SAFETY: `guard.prog` is live; `option_ptrs` holds `count` NUL-terminated strings.
        let code = unsafe { (self.compile_program)(guard.prog, count, option_ptrs.as_ptr()) };
        let elapsed = start.elapsed();
        // SAFETY: `guard.prog` is live; the pair is this compiler's log accessor.
        let log = unsafe {
            self.diag.read_output(
                guard.prog,
                self.log.0,
                self.log.1,
                (sym.log.size, sym.log.bytes),
                context,
            )
        }?;
        let log = log_text(&log);
        if code != 0 {
            return Err(Error::Driver {
                backend: sym.backend,
                call: sym.compile_program,
                code: i64::from(code),
                message: format!(
                    "{} compiling {context}:\n{log}",
                    self.diag.error_string(code)
                ),
            });
        }
        let mut outputs = Vec::with_capacity(self.outputs.len());
        for (i, (fns, names)) in self.outputs.iter().zip(sym.outputs).enumerate() {
            outputs.push(match fns {
                Some((size, bytes)) if want(i) => Some(
                    // SAFETY: `guard.prog` is live; the pair is one of this compiler's output
                    // accessors.
                    unsafe {
                        self.diag.read_output(
                            guard.prog,
                            *size,
                            *bytes,
                            (names.size, names.bytes),
                            context,
                        )
                    }?,
                ),
                _ => None,
            });
        }
        drop(guard);
        Ok(RtcOutput {
            outputs,
            log,
            elapsed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn no_strings(_: c_int) -> *const c_char {
        std::ptr::null()
    }

    #[test]
    fn inputs_logs_and_checks() {
        let i = CompileInputs::new("m.cu", "src", &[("a.h", "x"), ("b.h", "y")]).unwrap();
        assert_eq!(i.num_headers(), 2);
        // SAFETY: both arrays hold two pointers to live NUL-terminated strings.
        let second = unsafe { CStr::from_ptr(*i.include_names().add(1)) };
        assert_eq!(second.to_str().unwrap(), "b.h");
        let e = CompileInputs::new("m.cu", "s\0rc", &[]).unwrap_err();
        assert!(
            e.to_string().contains("kernel source contains a NUL byte"),
            "{e}"
        );
        assert_eq!(log_text(b"  warning\n\0\0"), "warning");
        let d = Diagnostics {
            backend: "cuda",
            compiler: "TESTRTC",
            get_error_string: no_strings,
        };
        assert!(d.check("x", 0, "c").is_ok());
        let e = d.check("x", 6, "m for t").unwrap_err().to_string();
        assert!(e.contains("TESTRTC error 6 (m for t)"), "{e}");
    }

    const SYMBOLS: RtcSymbols = RtcSymbols {
        backend: "cuda",
        compiler: "TESTRTC",
        version: "testrtcVersion",
        get_error_string: "testrtcGetErrorString",
        create_program: "testrtcCreateProgram",
        destroy_program: "testrtcDestroyProgram",
        compile_program: "testrtcCompileProgram",
        log: OutputSymbols {
            size: "testrtcGetProgramLogSize",
            bytes: "testrtcGetProgramLog",
            required: true,
        },
        outputs: &[],
    };

    #[test]
    fn a_library_without_the_symbols_is_named_with_what_it_lacks() {
        let e = RtcLibrary::open_first(&["libc.so.6", "libdoes-not-exist-mscclpp.so"], &SYMBOLS)
            .unwrap_err();
        assert!(e.contains("libc.so.6 (opened but lacks testrtc"), "{e}");
        // A library that does not open is named; the loader's message is at debug level.
        assert!(e.contains(", libdoes-not-exist-mscclpp.so;"), "{e}");
        assert!(!e.contains("cannot open shared object"), "{e}");
    }
}
