//! Kernel modules of the CUDA backend: compiled from the embedded sources with NVRTC for the
//! device's `sm_XY` on first use, cached on disk, loaded once per device.
//!
//! **Cache.** Under `<MSCCLPP_CACHE_DIR>/cuda/`, through `mscclpp_hal::kernel_cache` (keys,
//! entry format, atomic writes): the image is a cubin, or PTX where NVRTC gives no cubin.

use std::collections::HashMap;
use std::ffi::{CString, c_int};
use std::path::Path;
use std::sync::Arc;

use cudarc::driver::sys;
use mscclpp_hal::kernel::known_param_size;
use mscclpp_hal::kernel_cache::{self, CacheCounters, EntryFormat};
pub use mscclpp_hal::kernel_cache::{CacheStats, Fnv128, cache_path};
use mscclpp_hal::{Error, Kernel, KernelId, Result};

use crate::device::{Context, Features};
use crate::driver::check;
use crate::kernels::{self, HEADERS, Module};
use crate::nvrtc;

/// This backend's cache entries (a code object of another backend never matches).
const FORMAT: EntryFormat = EntryFormat {
    magic: *b"MSKC",
    version: 1,
};
static COUNTERS: CacheCounters = CacheCounters::new();

/// What kind of image a module was loaded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// A cubin for the exact architecture.
    Cubin,
    /// NUL-terminated PTX, JIT-compiled by the driver at load.
    Ptx,
}

impl ImageKind {
    fn code(self) -> u8 {
        match self {
            ImageKind::Cubin => 1,
            ImageKind::Ptx => 2,
        }
    }
    fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(ImageKind::Cubin),
            2 => Some(ImageKind::Ptx),
            _ => None,
        }
    }
}

/// How this process's kernel modules were obtained so far: "compiled in X s" versus "cache hit".
pub fn cache_stats() -> CacheStats {
    COUNTERS.stats()
}

/// The options every module is compiled with (besides the architecture); part of the key.
pub const COMPILE_OPTIONS: &str = "-std=c++17";

/// Extra NVRTC options from `MSCCLPP_NVRTC_OPTIONS` (whitespace-separated; for developers, e.g.
/// `--ptxas-options=-v` to see register and stack use in the compile log); part of the key.
pub fn extra_compile_options() -> Vec<String> {
    std::env::var("MSCCLPP_NVRTC_OPTIONS")
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The cache key of `module` compiled for `arch` by NVRTC `nvrtc_version`.
pub fn cache_key(
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    arch: &str,
    nvrtc_version: (i32, i32),
) -> u128 {
    kernel_cache::cache_key(
        "mscclpp-cuda kernel cache v1",
        name,
        source,
        headers,
        arch,
        nvrtc_version,
        &[COMPILE_OPTIONS.to_owned()]
            .into_iter()
            .chain(extra_compile_options())
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Encodes a cache entry.
pub fn encode_entry(key: u128, kind: ImageKind, image: &[u8]) -> Vec<u8> {
    FORMAT.encode(key, kind.code(), image)
}

/// Decodes a cache entry; `Err` says why the entry is unusable.
pub fn decode_entry(bytes: &[u8], key: u128) -> std::result::Result<(ImageKind, Vec<u8>), String> {
    let (kind, image) = FORMAT.decode(bytes, key)?;
    Ok((
        ImageKind::from_code(kind).ok_or("unknown image kind")?,
        image,
    ))
}

/// Reads a usable entry, or `None` (missing, unreadable or corrupt — logged, never fatal).
pub fn read_cache(path: &Path, key: u128) -> Option<(ImageKind, Vec<u8>)> {
    kernel_cache::read_cache(path, &COUNTERS, |b| decode_entry(b, key))
}

/// Writes an entry atomically.
pub fn write_cache(path: &Path, key: u128, kind: ImageKind, image: &[u8]) -> Result<()> {
    kernel_cache::write_atomic(path, &encode_entry(key, kind, image))
}

/// Gets the image of `module` for `arch`: from the cache under `dir`, else compiled (and
/// cached). `compile` is the NVRTC step (a parameter so that tests can run without NVRTC).
pub fn image_for(
    dir: &Path,
    module: &Module,
    arch: &str,
    nvrtc_version: (i32, i32),
    compile: impl FnOnce() -> Result<nvrtc::Compiled>,
) -> Result<(ImageKind, Vec<u8>)> {
    let key = cache_key(module.name, module.source, HEADERS, arch, nvrtc_version);
    let path = cache_path(dir, module.name, arch, key);
    let compiler = format!("NVRTC {}.{}", nvrtc_version.0, nvrtc_version.1);
    kernel_cache::cached_or_compiled(
        &COUNTERS,
        (module.name, arch, &compiler),
        || read_cache(&path, key),
        || {
            let compiled = compile()?;
            let image = match compiled.cubin {
                Some(c) => (ImageKind::Cubin, c),
                None => {
                    let mut ptx = compiled.ptx;
                    if ptx.last() != Some(&0) {
                        ptx.push(0);
                    }
                    (ImageKind::Ptx, ptx)
                }
            };
            Ok((image, compiled.log))
        },
        |(kind, image)| write_cache(&path, key, *kind, image),
    )
}

/// A module loaded into one device's context; unloaded on drop.
#[derive(Debug)]
pub struct LoadedModule {
    ctx: Arc<Context>,
    raw: sys::CUmodule,
    name: &'static str,
}

// SAFETY: a CUmodule is a driver handle usable from any thread with its context current.
unsafe impl Send for LoadedModule {}
// SAFETY: as above.
unsafe impl Sync for LoadedModule {}

impl Drop for LoadedModule {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: loaded by cuModuleLoadData, unloaded once; every kernel and every queued
            // launch of it holds this module, so none is left.
            let r = unsafe { sys::cuModuleUnload(self.raw) };
            if let Err(e) = check("cuModuleUnload", r) {
                tracing::warn!(module = self.name, "{e}");
            }
        }
    }
}

/// A kernel of a loaded module.
#[derive(Debug)]
pub struct CudaKernel {
    id: KernelId,
    func: sys::CUfunction,
    module: Arc<LoadedModule>,
    param_size: Option<usize>,
    max_threads_per_block: u32,
}

// SAFETY: a CUfunction is a driver handle usable from any thread; its module is kept alive.
unsafe impl Send for CudaKernel {}
// SAFETY: as above.
unsafe impl Sync for CudaKernel {}

impl CudaKernel {
    /// The raw function handle.
    pub fn raw(&self) -> sys::CUfunction {
        self.func
    }
    /// The module it belongs to.
    pub fn module(&self) -> &Arc<LoadedModule> {
        &self.module
    }
    /// Ordinal of the device whose context loaded it.
    pub fn device_ordinal(&self) -> usize {
        self.module.ctx.ordinal()
    }
    /// Bytes of its (single) argument struct, where the driver or the kernel table knows.
    pub fn param_size(&self) -> Option<usize> {
        self.param_size
    }
    /// Most threads per block this kernel can be launched with.
    pub fn max_threads_per_block(&self) -> u32 {
        self.max_threads_per_block
    }
}

impl Kernel for CudaKernel {
    fn id(&self) -> KernelId {
        self.id
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn max_threads_per_block(&self) -> Option<u32> {
        Some(CudaKernel::max_threads_per_block(self))
    }
}

fn load_module(
    ctx: &Arc<Context>,
    arch: &str,
    module: &'static Module,
) -> Result<Arc<LoadedModule>> {
    let version = nvrtc::nvrtc_version();
    let dir = mscclpp_hal::env::cache_dir().join("cuda");
    let (kind, image) = match version {
        Ok(v) => image_for(&dir, module, arch, v, || module.compile(arch))?,
        // Without NVRTC nothing can be compiled (and the cache key needs its version).
        Err(e) => return Err(e),
    };
    ctx.bind()?;
    let mut raw: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `image` is a complete cubin, or NUL-terminated PTX; the context is current.
    let r = unsafe { sys::cuModuleLoadData(&mut raw, image.as_ptr().cast()) };
    check("cuModuleLoadData", r)
        .map_err(|e| e.with_context(|| format!("module {}, {kind:?} for {arch}", module.name)))?;
    Ok(Arc::new(LoadedModule {
        ctx: ctx.clone(),
        raw,
        name: module.name,
    }))
}

/// Loads kernel `id` on the device of `ctx`, loading (and if needed compiling) its module once.
pub fn load_kernel(
    ctx: &Arc<Context>,
    arch: &str,
    features: Features,
    loaded: &mut HashMap<&'static str, Arc<LoadedModule>>,
    id: KernelId,
) -> Result<CudaKernel> {
    let module = kernels::module_for(id).ok_or_else(|| {
        Error::invalid(format!(
            "no CUDA kernel named {id}: none of the embedded modules ({}) defines it",
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
    let name = CString::new(id.name())
        .map_err(|_| Error::invalid(format!("kernel name {id:?} contains a NUL byte")))?;
    let mut func: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: live module of the current context; NUL-terminated name; valid out-pointer.
    check("cuModuleGetFunction", unsafe {
        sys::cuModuleGetFunction(&mut func, m.raw, name.as_ptr())
    })
    .map_err(|e| Error::invalid(format!("kernel {id} not found in module {}: {e}", m.name)))?;
    let mut max_threads: c_int = 0;
    // SAFETY: live function; valid out-pointer.
    check("cuFuncGetAttribute", unsafe {
        sys::cuFuncGetAttribute(
            &mut max_threads,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            func,
        )
    })?;
    let param_size = if features.func_param_info {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: live function; valid out-pointers; the symbol exists (probe).
        match unsafe { sys::cuFuncGetParamInfo(func, 0, &mut offset, &mut size) } {
            sys::CUresult::CUDA_SUCCESS => Some(offset + size),
            // No parameter 0: the kernel takes no arguments.
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => Some(0),
            _ => known_param_size(id),
        }
    } else {
        known_param_size(id)
    };
    Ok(CudaKernel {
        id,
        func,
        module: m,
        param_size,
        max_threads_per_block: u32::try_from(max_threads).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "mscclpp-cuda-cache-test-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn fake_compiled(tag: u8) -> nvrtc::Compiled {
        nvrtc::Compiled {
            ptx: vec![b'p', tag, 0],
            cubin: Some(vec![0x7f, b'E', b'L', b'F', tag]),
            log: String::new(),
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn key_depends_on_source_headers_arch_and_version() {
        let h = [("a.cuh", "x")];
        let base = cache_key("m.cu", "src", &h, "sm_90", (13, 0));
        assert_eq!(base, cache_key("m.cu", "src", &h, "sm_90", (13, 0)));
        assert_ne!(base, cache_key("m.cu", "src2", &h, "sm_90", (13, 0)));
        assert_ne!(
            base,
            cache_key("m.cu", "src", &[("a.cuh", "y")], "sm_90", (13, 0))
        );
        assert_ne!(
            base,
            cache_key("m.cu", "src", &[("b.cuh", "x")], "sm_90", (13, 0))
        );
        assert_ne!(base, cache_key("m.cu", "src", &h, "sm_80", (13, 0)));
        assert_ne!(base, cache_key("m.cu", "src", &h, "sm_90", (13, 1)));
        // Field boundaries matter.
        assert_ne!(
            cache_key("m.cu", "ab", &[("c", "")], "sm_90", (13, 0)),
            cache_key("m.cu", "a", &[("bc", "")], "sm_90", (13, 0))
        );
    }

    #[test]
    fn entry_round_trips_and_rejects_corruption() {
        let e = encode_entry(42, ImageKind::Cubin, b"image bytes");
        assert_eq!(
            decode_entry(&e, 42).unwrap(),
            (ImageKind::Cubin, b"image bytes".to_vec())
        );
        assert!(decode_entry(&e, 43).unwrap_err().contains("key"));
        let mut bad = e.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(decode_entry(&bad, 42).unwrap_err().contains("checksum"));
        assert!(decode_entry(&e[..e.len() - 1], 42).is_err());
        assert!(decode_entry(&e[..10], 42).is_err());
        assert!(decode_entry(b"", 42).is_err());
    }

    #[test]
    fn miss_compiles_and_writes_then_hit_reads_and_corruption_recompiles() {
        let dir = temp_dir("flow");
        let module = &kernels::MODULES[0];
        let before = cache_stats();
        let (kind, image) =
            image_for(&dir, module, "sm_90", (13, 0), || Ok(fake_compiled(1))).unwrap();
        assert_eq!(
            (kind, image.clone()),
            (ImageKind::Cubin, vec![0x7f, b'E', b'L', b'F', 1])
        );
        // A hit must not call the compiler.
        let (_, again) = image_for(&dir, module, "sm_90", (13, 0), || {
            panic!("compiled although cached")
        })
        .unwrap();
        assert_eq!(again, image);
        // Another arch is another entry.
        let (_, other) =
            image_for(&dir, module, "sm_80", (13, 0), || Ok(fake_compiled(2))).unwrap();
        assert_eq!(other[4], 2);
        // Corrupt the sm_90 entry: it is recompiled and rewritten, not fatal.
        let key = cache_key(module.name, module.source, HEADERS, "sm_90", (13, 0));
        let path = cache_path(&dir, module.name, "sm_90", key);
        std::fs::write(&path, b"garbage").unwrap();
        let (_, fixed) =
            image_for(&dir, module, "sm_90", (13, 0), || Ok(fake_compiled(3))).unwrap();
        assert_eq!(fixed[4], 3);
        assert_eq!(read_cache(&path, key).unwrap().1[4], 3);
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let after = cache_stats();
        assert!(after.compiles >= before.compiles + 3);
        assert!(after.disk_hits > before.disk_hits);
        assert!(after.corrupt_entries > before.corrupt_entries);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ptx_fallback_is_nul_terminated_and_unwritable_cache_is_not_fatal() {
        // A cache "directory" that is a file: writing fails, loading still succeeds.
        let dir = temp_dir("unwritable");
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        std::fs::write(&dir, b"not a directory").unwrap();
        let module = &kernels::MODULES[0];
        let (kind, image) = image_for(&dir, module, "compute_90", (13, 0), || {
            Ok(nvrtc::Compiled {
                ptx: b"ptx".to_vec(),
                cubin: None,
                log: "warning".into(),
                elapsed: Duration::ZERO,
            })
        })
        .unwrap();
        assert_eq!(kind, ImageKind::Ptx);
        assert_eq!(image, b"ptx\0");
        let _ = std::fs::remove_file(&dir);
    }

    #[test]
    fn compile_errors_propagate() {
        let dir = temp_dir("err");
        let module = &kernels::MODULES[0];
        let e = image_for(&dir, module, "sm_90", (13, 0), || {
            Err(Error::unavailable("NVRTC", "not installed"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("NVRTC"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn known_sizes_match_the_hal_structs() {
        assert_eq!(known_param_size(KernelId::FILL_U32), Some(24));
        assert_eq!(known_param_size(KernelId::ATOMIC_ADD_U64), Some(16));
        assert_eq!(known_param_size(KernelId("no_such_kernel")), None);
    }
}
