//! Finding and opening the profiler plugin `NCCL_PROFILER_PLUGIN` names, as NCCL 2.28+ does:
//! `none` disables it; unset or empty tries `libnccl-profiler.so`; a value is tried as given (a
//! path, or a library name the loader searches), then, when it is neither a path nor a
//! `lib*.so` name, as `libnccl-profiler-<value>.so`; a prefix of `STATIC_PLUGIN` looks in the
//! program itself. The newest `ncclProfiler_vN` it exports (6 down to 1) is used. The library
//! is opened once per process, at the first communicator, with `RTLD_NOW | RTLD_LOCAL`, and
//! stays loaded; a failure to find or open it is not retried (NCCL's rule too).

use std::ffi::{CStr, CString};
use std::sync::OnceLock;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

use super::abi::{SYMBOLS, Table};

/// An opened plugin: its version and table (the library kept open with it).
#[derive(Debug)]
pub struct Plugin {
    /// `N` of the `ncclProfiler_vN` found.
    pub version: u32,
    /// The table.
    pub table: Table,
    /// Its name, for logs.
    pub name: String,
    /// Where it was found.
    pub path: String,
    _lib: Library,
}

// SAFETY: the table holds function pointers and a name pointer into the library, which lives as
// long as the plugin; NCCL calls plugins from several threads, so plugins are thread-safe.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

/// The process's plugin, opened at the first call; `None` when there is none (or it failed:
/// logged once).
pub fn plugin() -> Option<&'static Plugin> {
    static P: OnceLock<Option<Plugin>> = OnceLock::new();
    P.get_or_init(|| {
        let setting = std::env::var("NCCL_PROFILER_PLUGIN").ok();
        match open(setting.as_deref()) {
            Ok(p) => {
                if let Some(p) = &p {
                    tracing::info!(
                        target: crate::debug::INIT,
                        "PROFILER/Plugin: loaded {} (v{}) from {}",
                        p.name,
                        p.version,
                        p.path
                    );
                }
                p
            }
            Err(why) => {
                tracing::warn!(target: crate::debug::INIT, "PROFILER/Plugin: {why}; continuing without a profiler");
                None
            }
        }
    })
    .as_ref()
}

/// The plugin `setting` names: `Ok(None)` when none is asked for (or the default name is not
/// found), `Err` when the one named cannot be used.
pub fn open(setting: Option<&str>) -> Result<Option<Plugin>, String> {
    let tries: Vec<Option<String>> = match setting.map(str::trim) {
        Some(v) if v.eq_ignore_ascii_case("none") => return Ok(None),
        None | Some("") => vec![Some("libnccl-profiler.so".into())],
        Some(v) => {
            let mut t = Vec::new();
            let is_static = v.len() <= "STATIC_PLUGIN".len()
                && "STATIC_PLUGIN"[..v.len()].eq_ignore_ascii_case(v);
            t.push(if is_static { None } else { Some(v.to_owned()) });
            let path_or_lib_name = v.contains('/') || (v.starts_with("lib") && v.ends_with(".so"));
            if !path_or_lib_name {
                t.push(Some(format!("libnccl-profiler-{v}.so")));
            }
            t
        }
    };
    let mut errors = Vec::new();
    for name in &tries {
        let lib = match name {
            // SAFETY: loading a library runs its initialisers; the user named it as NCCL's
            // profiler plugin, which NCCL would load the same way.
            Some(n) => unsafe { Library::open(Some(n), RTLD_NOW | RTLD_LOCAL) },
            None => Ok(Library::this()),
        };
        let lib = match lib {
            Ok(l) => l,
            Err(e) => {
                errors.push(format!(
                    "{}: {e}",
                    name.as_deref().unwrap_or("(the program)")
                ));
                continue;
            }
        };
        let path = name.clone().unwrap_or_else(|| "(the program)".into());
        for (version, sym) in SYMBOLS {
            // SAFETY: the symbol is NCCL's profiler table of that version (six pointers).
            let table = unsafe { lib.get::<*const Table>(sym.to_bytes_with_nul()) };
            let Ok(table) = table else { continue };
            let ptr = *table;
            if ptr.is_null() {
                continue;
            }
            // SAFETY: a non-null table exported under NCCL's name; read once, by value.
            let table = unsafe { ptr.read() };
            if table.init.is_null() || table.start_event.is_none() {
                return Err(format!(
                    "{path}: ncclProfiler_v{version} has no init or startEvent"
                ));
            }
            let name = if table.name.is_null() {
                "(unnamed)".to_owned()
            } else {
                // SAFETY: the plugin's NUL-terminated name, in the library.
                unsafe { CStr::from_ptr(table.name) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Ok(Some(Plugin {
                version,
                table,
                name,
                path,
                _lib: lib,
            }));
        }
        return Err(format!(
            "external profiler plugin {path} is unsupported: it exports none of ncclProfiler_v1 to v6"
        ));
    }
    if setting.map(str::trim).is_none_or(str::is_empty) {
        // The default name: absent is the usual case, not an error.
        return Ok(None);
    }
    Err(format!("could not open it: {}", errors.join("; ")))
}

/// A communicator name as the C string `init` takes (kept by the caller for the
/// communicator's life: plugins may keep the pointer).
pub fn c_name(name: Option<&str>) -> Option<CString> {
    name.and_then(|n| CString::new(n).ok())
}
