//! Kernel modules of the ROCm backend: compiled from the embedded sources with hipRTC for the
//! device's gfx processor on first use, cached on disk, loaded once per device.
//!
//! **Cache.** Under `<MSCCLPP_CACHE_DIR>/rocm/`, through `mscclpp_hal::kernel_cache` (keys,
//! entry format with magic `MSKR`, atomic writes): the image is the code object.
//!
//! **Target.** The device reports a target id such as `gfx90a:sramecc+:xnack-`; modules are
//! compiled for its processor alone (`gfx90a`, see [`crate::device::compile_target`]), whose
//! code object the loader accepts whatever the device's SRAMECC/XNACK settings.

use std::collections::HashMap;
use std::ffi::{CString, c_int};
use std::path::Path;
use std::sync::Arc;

use mscclpp_hal::kernel::known_param_size;
use mscclpp_hal::kernel_cache::{self, CacheCounters, EntryFormat};
pub use mscclpp_hal::kernel_cache::{CacheStats, Fnv128, cache_path};
use mscclpp_hal::{Error, Kernel, KernelId, Result};

use crate::device::{DeviceCtx, compile_target};
use crate::ffi::{self, HipFunction, HipModule};
use crate::hiprtc;
use crate::kernels::{self, HEADERS, Module};

/// This backend's cache entries (a cubin of another backend never matches).
const FORMAT: EntryFormat = EntryFormat {
    magic: *b"MSKR",
    version: 1,
};
/// The one image kind: an AMDGPU code object.
const KIND_CODE_OBJECT: u8 = 1;
static COUNTERS: CacheCounters = CacheCounters::new();

/// How this process's kernel modules were obtained so far: "compiled in X s" versus "cache hit".
pub fn cache_stats() -> CacheStats {
    COUNTERS.stats()
}

/// The options every module is compiled with (besides the target); part of the key. Must match
/// what [`hiprtc::compile`] passes.
pub const COMPILE_OPTIONS: &str = "-std=c++17";

/// The cache key of `module` compiled for `target` by hipRTC `version`.
pub fn cache_key(
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    target: &str,
    version: (i32, i32),
) -> u128 {
    kernel_cache::cache_key(
        "mscclpp-rocm kernel cache v1",
        name,
        source,
        headers,
        target,
        version,
        COMPILE_OPTIONS,
    )
}

/// Encodes a cache entry.
pub fn encode_entry(key: u128, image: &[u8]) -> Vec<u8> {
    FORMAT.encode(key, KIND_CODE_OBJECT, image)
}

/// Decodes a cache entry; `Err` says why the entry is unusable.
pub fn decode_entry(bytes: &[u8], key: u128) -> std::result::Result<Vec<u8>, String> {
    match FORMAT.decode(bytes, key)? {
        (KIND_CODE_OBJECT, image) => Ok(image),
        (kind, _) => Err(format!("unknown image kind {kind}")),
    }
}

/// Reads a usable entry, or `None` (missing, unreadable or corrupt — logged, never fatal).
pub fn read_cache(path: &Path, key: u128) -> Option<Vec<u8>> {
    kernel_cache::read_cache(path, &COUNTERS, |b| decode_entry(b, key))
}

/// Writes an entry atomically.
pub fn write_cache(path: &Path, key: u128, image: &[u8]) -> Result<()> {
    kernel_cache::write_atomic(path, &encode_entry(key, image))
}

/// Gets the code object of `module` for `target`: from the cache under `dir`, else compiled
/// (and cached). `compile` is the hipRTC step (a parameter so that tests can run a fake one).
pub fn image_for(
    dir: &Path,
    module: &Module,
    target: &str,
    version: (i32, i32),
    compile: impl FnOnce() -> Result<hiprtc::Compiled>,
) -> Result<Vec<u8>> {
    let key = cache_key(module.name, module.source, HEADERS, target, version);
    let path = cache_path(dir, module.name, target, key);
    let compiler = format!("hipRTC {}.{}", version.0, version.1);
    kernel_cache::cached_or_compiled(
        &COUNTERS,
        (module.name, target, &compiler),
        || read_cache(&path, key),
        || compile().map(|c| (c.code, c.log)),
        |code| write_cache(&path, key, code),
    )
}

/// A module loaded on one device; unloaded on drop.
#[derive(Debug)]
pub struct LoadedModule {
    ctx: Arc<DeviceCtx>,
    raw: HipModule,
    name: &'static str,
}

// SAFETY: a hipModule_t is a runtime handle usable from any thread.
unsafe impl Send for LoadedModule {}
// SAFETY: as above.
unsafe impl Sync for LoadedModule {}

impl Drop for LoadedModule {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            let api = self.ctx.api();
            // SAFETY: loaded by hipModuleLoadData, unloaded once; every kernel and every queued
            // launch of it holds this module, so none is left.
            let r = unsafe { (api.module_unload)(self.raw) };
            if let Err(e) = api.check("hipModuleUnload", r) {
                tracing::warn!(module = self.name, "{e}");
            }
        }
    }
}

/// A kernel of a loaded module.
#[derive(Debug)]
pub struct RocmKernel {
    id: KernelId,
    func: HipFunction,
    module: Arc<LoadedModule>,
    param_size: Option<usize>,
    max_threads_per_block: u32,
}

// SAFETY: a hipFunction_t is a runtime handle usable from any thread; its module is kept alive.
unsafe impl Send for RocmKernel {}
// SAFETY: as above.
unsafe impl Sync for RocmKernel {}

impl RocmKernel {
    /// The raw function handle.
    pub fn raw(&self) -> HipFunction {
        self.func
    }
    /// The module it belongs to.
    pub fn module(&self) -> &Arc<LoadedModule> {
        &self.module
    }
    /// Ordinal of the device that loaded it.
    pub fn device_ordinal(&self) -> usize {
        self.module.ctx.ordinal()
    }
    /// Bytes of its (single) argument struct, where the kernel table knows (HIP has no
    /// parameter-introspection call).
    pub fn param_size(&self) -> Option<usize> {
        self.param_size
    }
    /// Most threads per block this kernel can be launched with.
    pub fn max_threads_per_block(&self) -> u32 {
        self.max_threads_per_block
    }
}

impl Kernel for RocmKernel {
    fn id(&self) -> KernelId {
        self.id
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn max_threads_per_block(&self) -> Option<u32> {
        Some(RocmKernel::max_threads_per_block(self))
    }
}

fn load_module(
    ctx: &Arc<DeviceCtx>,
    arch: &str,
    module: &'static Module,
) -> Result<Arc<LoadedModule>> {
    let target = compile_target(arch);
    // Without hipRTC nothing can be compiled (and the cache key needs its version).
    let version = hiprtc::hiprtc_version()?;
    let dir = mscclpp_hal::env::cache_dir().join("rocm");
    let image = image_for(&dir, module, target, version, || module.compile(target))?;
    ctx.bind()?;
    let api = ctx.api();
    let mut raw: HipModule = std::ptr::null_mut();
    // SAFETY: `image` is a complete code object (hipRTC output or a checksummed cache entry of
    // one); valid out-pointer; the device is current.
    let r = unsafe { (api.module_load_data)(&mut raw, image.as_ptr().cast()) };
    api.check("hipModuleLoadData", r).map_err(|e| {
        e.with_context(|| {
            format!(
                "module {}, code object for {target} on a {arch} device",
                module.name
            )
        })
    })?;
    Ok(Arc::new(LoadedModule {
        ctx: ctx.clone(),
        raw,
        name: module.name,
    }))
}

/// Loads kernel `id` on the device of `ctx`, loading (and if needed compiling) its module once.
pub fn load_kernel(
    ctx: &Arc<DeviceCtx>,
    arch: &str,
    loaded: &mut HashMap<&'static str, Arc<LoadedModule>>,
    id: KernelId,
) -> Result<RocmKernel> {
    let module = kernels::module_for(id).ok_or_else(|| {
        Error::invalid(format!(
            "no HIP kernel named {id}: none of the embedded modules ({}) defines it",
            kernels::MODULES
                .iter()
                .map(|m| m.name)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let m = match loaded.get(module.name) {
        Some(m) => m.clone(),
        None => {
            let m = load_module(ctx, arch, module)?;
            loaded.insert(module.name, m.clone());
            m
        }
    };
    ctx.bind()?;
    let api = ctx.api();
    let name = CString::new(id.name())
        .map_err(|_| Error::invalid(format!("kernel name {id:?} contains a NUL byte")))?;
    let mut func: HipFunction = std::ptr::null_mut();
    // SAFETY: live module; NUL-terminated name; valid out-pointer.
    api.check("hipModuleGetFunction", unsafe {
        (api.module_get_function)(&mut func, m.raw, name.as_ptr())
    })
    .map_err(|e| Error::invalid(format!("kernel {id} not found in module {}: {e}", m.name)))?;
    let mut max_threads: c_int = 0;
    // SAFETY: live function; valid out-pointer.
    let r = unsafe {
        (api.func_get_attribute)(
            &mut max_threads,
            ffi::FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            func,
        )
    };
    // Some runtimes do not answer this for module functions: the device limit then applies.
    let max_threads_per_block = match (r, u32::try_from(max_threads)) {
        (ffi::code::SUCCESS, Ok(n)) if n > 0 => n,
        _ => u32::MAX,
    };
    Ok(RocmKernel {
        id,
        func,
        module: m,
        param_size: known_param_size(id),
        max_threads_per_block,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "mscclpp-rocm-cache-test-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn fake_compiled(tag: u8) -> hiprtc::Compiled {
        hiprtc::Compiled {
            code: vec![0x7f, b'E', b'L', b'F', tag],
            log: String::new(),
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn key_depends_on_source_headers_target_and_version() {
        let h = [("a.cuh", "x")];
        let base = cache_key("m.hip", "src", &h, "gfx90a", (5, 2));
        assert_eq!(base, cache_key("m.hip", "src", &h, "gfx90a", (5, 2)));
        assert_ne!(base, cache_key("m.hip", "src2", &h, "gfx90a", (5, 2)));
        assert_ne!(
            base,
            cache_key("m.hip", "src", &[("a.cuh", "y")], "gfx90a", (5, 2))
        );
        assert_ne!(
            base,
            cache_key("m.hip", "src", &[("b.cuh", "x")], "gfx90a", (5, 2))
        );
        assert_ne!(base, cache_key("m.hip", "src", &h, "gfx942", (5, 2)));
        assert_ne!(base, cache_key("m.hip", "src", &h, "gfx90a", (6, 0)));
        assert_ne!(
            cache_key("m.hip", "ab", &[("c", "")], "gfx90a", (5, 2)),
            cache_key("m.hip", "a", &[("bc", "")], "gfx90a", (5, 2))
        );
    }

    #[test]
    fn entry_round_trips_and_rejects_corruption() {
        let e = encode_entry(42, b"code object");
        assert_eq!(&e[..4], b"MSKR");
        assert_eq!(decode_entry(&e, 42).unwrap(), b"code object".to_vec());
        assert!(decode_entry(&e, 43).unwrap_err().contains("key"));
        let mut bad = e.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(decode_entry(&bad, 42).unwrap_err().contains("checksum"));
        let mut kind = e.clone();
        kind[6] = 9;
        assert!(decode_entry(&kind, 42).unwrap_err().contains("kind"));
        assert!(decode_entry(&e[..e.len() - 1], 42).is_err());
        assert!(decode_entry(&e[..10], 42).is_err());
        assert!(decode_entry(b"", 42).is_err());
    }

    #[test]
    fn miss_compiles_and_writes_then_hit_reads_and_corruption_recompiles() {
        let dir = temp_dir("flow");
        let module = &kernels::MODULES[0];
        let before = cache_stats();
        let image = image_for(&dir, module, "gfx90a", (5, 2), || Ok(fake_compiled(1))).unwrap();
        assert_eq!(image, vec![0x7f, b'E', b'L', b'F', 1]);
        // A hit must not call the compiler.
        let again = image_for(&dir, module, "gfx90a", (5, 2), || {
            panic!("compiled although cached")
        })
        .unwrap();
        assert_eq!(again, image);
        // Another target is another entry.
        let other = image_for(&dir, module, "gfx942", (5, 2), || Ok(fake_compiled(2))).unwrap();
        assert_eq!(other[4], 2);
        // Another hipRTC version is another entry.
        let newer = image_for(&dir, module, "gfx90a", (6, 0), || Ok(fake_compiled(4))).unwrap();
        assert_eq!(newer[4], 4);
        // Corrupt the gfx90a entry: it is recompiled and rewritten, not fatal.
        let key = cache_key(module.name, module.source, HEADERS, "gfx90a", (5, 2));
        let path = cache_path(&dir, module.name, "gfx90a", key);
        assert!(path.starts_with(&dir));
        std::fs::write(&path, b"garbage").unwrap();
        let fixed = image_for(&dir, module, "gfx90a", (5, 2), || Ok(fake_compiled(3))).unwrap();
        assert_eq!(fixed[4], 3);
        assert_eq!(read_cache(&path, key).unwrap()[4], 3);
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let after = cache_stats();
        assert!(after.compiles >= before.compiles + 4);
        assert!(after.disk_hits > before.disk_hits);
        assert!(after.corrupt_entries > before.corrupt_entries);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unwritable_cache_is_not_fatal_and_compile_errors_propagate() {
        // A cache "directory" that is a file: writing fails, loading still succeeds.
        let dir = temp_dir("unwritable");
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        std::fs::write(&dir, b"not a directory").unwrap();
        let module = &kernels::MODULES[0];
        let image = image_for(&dir, module, "gfx908", (5, 2), || Ok(fake_compiled(5))).unwrap();
        assert_eq!(image[4], 5);
        let _ = std::fs::remove_file(&dir);

        let dir = temp_dir("err");
        let e = image_for(&dir, module, "gfx90a", (5, 2), || {
            Err(Error::unavailable("hipRTC", "not installed"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("hipRTC"), "{e}");
        assert!(!dir.exists() || std::fs::read_dir(&dir).unwrap().next().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The real hipRTC path through the cache, where hipRTC is installed (Debian's ROCm 5.2 on
    /// this repository's build machines): a miss compiles a real code object, a hit returns it.
    #[test]
    fn real_hiprtc_through_the_cache_or_skipped() {
        let Ok(version) = hiprtc::hiprtc_version() else {
            return;
        };
        let dir = temp_dir("real");
        let module = kernels::module_for(KernelId::FILL_U32).unwrap();
        let image =
            image_for(&dir, module, "gfx90a", version, || module.compile("gfx90a")).unwrap();
        assert!(image.starts_with(b"\x7fELF"));
        let hit = image_for(&dir, module, "gfx90a", version, || panic!("recompiled")).unwrap();
        assert_eq!(hit, image);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn known_sizes_match_the_hal_structs() {
        assert_eq!(known_param_size(KernelId::FILL_U32), Some(24));
        assert_eq!(known_param_size(KernelId::ATOMIC_ADD_U64), Some(16));
        assert_eq!(known_param_size(KernelId("no_such_kernel")), None);
    }
}
