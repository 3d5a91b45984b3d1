//! The logger NCCL hands its plugins (`ncclDebugLogger_t`), for the plugins this project opens
//! (net plugins in `mscclpp-transports`, profiler plugins in the C library): their lines go to
//! `tracing`.

use std::ffi::{CStr, c_char, c_int, c_ulong};

/// The plugin's log lines, into `tracing` (target `mscclpp::plugin`). The format's arguments
/// are not expanded: a Rust function cannot take C varargs, so the line is the format string
/// itself, with the file and line. Called as a variadic function; the fixed arguments arrive
/// as in a plain call (System V x86-64 and AAPCS64 on Linux), so reading only them is sound.
pub extern "C" fn plugin_log(
    level: c_int,
    _flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
) {
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: the plugin passes NUL-terminated strings that live for the call.
            unsafe { CStr::from_ptr(p) }
                .to_string_lossy()
                .trim_end()
                .to_owned()
        }
    };
    let (file, fmt) = (text(file), text(fmt));
    // ncclDebugLogLevel: NONE 0, VERSION 1, WARN 2, INFO 3, ABORT 4, TRACE 5.
    match level {
        2 | 4 => tracing::warn!(target: "mscclpp::plugin", "{file}:{line} {fmt}"),
        1 | 3 => tracing::info!(target: "mscclpp::plugin", "{file}:{line} {fmt}"),
        _ => tracing::trace!(target: "mscclpp::plugin", "{file}:{line} {fmt}"),
    }
}
