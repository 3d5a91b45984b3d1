//! What the GPU backends' run-time compilers (NVRTC, hipRTC) share: the C strings of a compile's
//! inputs (the source and its headers, handed over in memory), error strings and checks of the
//! compilers' `int` result codes, size-then-bytes outputs (logs, images), and the log's
//! clean-up. The compilers' entry points are resolved and called by the backends; this module
//! only sees them as function pointers of the C shape both compilers use.

use std::ffi::{CStr, CString, c_char, c_int};

use crate::error::{Error, Result};

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
}
