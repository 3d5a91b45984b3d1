//! Kernel modules of the CUDA backend: compiled from the embedded sources with NVRTC for the
//! device's `sm_XY` on first use, cached on disk, loaded once per device.
//!
//! **Cache.** Under `<MSCCLPP_CACHE_DIR>/cuda/`, one file per (module, arch, key), where the key
//! is a 128-bit FNV-1a hash of the module's source, every embedded header (names and contents),
//! the architecture, the NVRTC version and the compile options. A file holds a small header
//! (magic, version, key, image kind, length, checksum) and the image (cubin, or PTX where NVRTC
//! gives no cubin). Files are written to a temporary name and renamed into place, so readers
//! never see half a file; a corrupt or unreadable entry is recompiled and rewritten, never fatal.

use std::collections::HashMap;
use std::ffi::{CString, c_int};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use mscclpp_hal::{Error, Kernel, KernelId, Result};

use crate::device::{Context, Features};
use crate::driver::check;
use crate::kernels::{self, HEADERS, Module};
use crate::nvrtc;

const CACHE_MAGIC: [u8; 4] = *b"MSKC";
const CACHE_VERSION: u16 = 1;
/// Header bytes: magic 4, version 2, kind 1, pad 1, key 16, length 8, checksum 8.
const CACHE_HEADER: usize = 40;
/// Largest image accepted from the cache (a bound on what a corrupt file can make us read).
const MAX_IMAGE: u64 = 256 << 20;

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

/// Counters of kernel-module loads in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Modules compiled by NVRTC (cache misses).
    pub compiles: u64,
    /// Modules read from the disk cache.
    pub disk_hits: u64,
    /// Total time spent in NVRTC.
    pub compile_time: Duration,
    /// Cache entries that were present but unusable (corrupt, wrong key) and were recompiled.
    pub corrupt_entries: u64,
}

static COMPILES: AtomicU64 = AtomicU64::new(0);
static DISK_HITS: AtomicU64 = AtomicU64::new(0);
static COMPILE_NANOS: AtomicU64 = AtomicU64::new(0);
static CORRUPT: AtomicU64 = AtomicU64::new(0);

/// How this process's kernel modules were obtained so far: "compiled in X s" versus "cache hit".
pub fn cache_stats() -> CacheStats {
    CacheStats {
        compiles: COMPILES.load(Ordering::Relaxed),
        disk_hits: DISK_HITS.load(Ordering::Relaxed),
        compile_time: Duration::from_nanos(COMPILE_NANOS.load(Ordering::Relaxed)),
        corrupt_entries: CORRUPT.load(Ordering::Relaxed),
    }
}

/// 128-bit FNV-1a: stable across builds and platforms (unlike `std`'s hasher).
#[derive(Debug, Clone, Copy)]
pub struct Fnv128(u128);

impl Default for Fnv128 {
    fn default() -> Self {
        Fnv128(0x6c62_272e_07bb_0142_62b8_2175_6295_c58d)
    }
}

impl Fnv128 {
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013B;

    /// Mixes in raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        for &x in b {
            self.0 ^= u128::from(x);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
        self
    }

    /// Mixes in a length-prefixed field (so that field boundaries matter).
    pub fn field(&mut self, b: &[u8]) -> &mut Self {
        self.bytes(&(b.len() as u64).to_le_bytes()).bytes(b)
    }

    /// The hash.
    pub fn finish(&self) -> u128 {
        self.0
    }
}

/// The options every module is compiled with (besides the architecture); part of the key.
pub const COMPILE_OPTIONS: &str = "-std=c++17";

/// The cache key of `module` compiled for `arch` by NVRTC `nvrtc_version`.
pub fn cache_key(
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    arch: &str,
    nvrtc_version: (i32, i32),
) -> u128 {
    let mut h = Fnv128::default();
    h.field(b"mscclpp-cuda kernel cache v1")
        .field(name.as_bytes())
        .field(source.as_bytes());
    for (n, c) in headers {
        h.field(n.as_bytes()).field(c.as_bytes());
    }
    h.field(arch.as_bytes())
        .field(&nvrtc_version.0.to_le_bytes())
        .field(&nvrtc_version.1.to_le_bytes())
        .field(COMPILE_OPTIONS.as_bytes());
    h.finish()
}

fn checksum(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// The file that holds the entry for (module, arch, key) under `dir`.
pub fn cache_path(dir: &Path, module: &str, arch: &str, key: u128) -> PathBuf {
    let stem: String = module
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let arch: String = arch
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    dir.join(format!("{stem}-{arch}-{key:032x}.bin"))
}

/// Encodes a cache entry.
pub fn encode_entry(key: u128, kind: ImageKind, image: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(CACHE_HEADER + image.len());
    out.extend_from_slice(&CACHE_MAGIC);
    out.extend_from_slice(&CACHE_VERSION.to_le_bytes());
    out.push(kind.code());
    out.push(0);
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&(image.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(image).to_le_bytes());
    out.extend_from_slice(image);
    out
}

/// Decodes a cache entry, checking magic, version, key, length and checksum; `Err` says why
/// the entry is unusable.
pub fn decode_entry(bytes: &[u8], key: u128) -> std::result::Result<(ImageKind, Vec<u8>), String> {
    let header = bytes
        .get(..CACHE_HEADER)
        .ok_or_else(|| format!("truncated header ({} bytes)", bytes.len()))?;
    if header[..4] != CACHE_MAGIC {
        return Err("bad magic".into());
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != CACHE_VERSION {
        return Err(format!("version {version}, expected {CACHE_VERSION}"));
    }
    let kind = ImageKind::from_code(header[6]).ok_or("unknown image kind")?;
    let mut k = [0u8; 16];
    k.copy_from_slice(&header[8..24]);
    if u128::from_le_bytes(k) != key {
        return Err("key mismatch".into());
    }
    let mut l = [0u8; 8];
    l.copy_from_slice(&header[24..32]);
    let len = u64::from_le_bytes(l);
    let mut c = [0u8; 8];
    c.copy_from_slice(&header[32..40]);
    let sum = u64::from_le_bytes(c);
    let image = &bytes[CACHE_HEADER..];
    if len > MAX_IMAGE || image.len() as u64 != len {
        return Err(format!(
            "length {len} disagrees with the {} bytes present",
            image.len()
        ));
    }
    if checksum(image) != sum {
        return Err("checksum mismatch".into());
    }
    Ok((kind, image.to_vec()))
}

/// Reads a usable entry, or `None` (missing, unreadable or corrupt — logged, never fatal).
pub fn read_cache(path: &Path, key: u128) -> Option<(ImageKind, Vec<u8>)> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), "kernel cache entry unreadable, recompiling: {e}");
            CORRUPT.fetch_add(1, Ordering::Relaxed);
            return None;
        }
    };
    match decode_entry(&bytes, key) {
        Ok(v) => Some(v),
        Err(why) => {
            tracing::warn!(path = %path.display(), "kernel cache entry unusable ({why}), recompiling");
            CORRUPT.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Writes an entry atomically (temporary file in the same directory, then rename).
pub fn write_cache(path: &Path, key: u128, kind: ImageKind, image: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::Internal(format!("cache path {} has no parent", path.display())))?;
    std::fs::create_dir_all(dir).map_err(|e| {
        Error::io(
            format!("creating kernel cache directory {}", dir.display()),
            e,
        )
    })?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = path.with_extension(format!("tmp.{}.{nanos}", std::process::id()));
    let data = encode_entry(key, kind, image);
    if let Err(e) = std::fs::write(&tmp, &data) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(
            format!("writing kernel cache entry {}", tmp.display()),
            e,
        ));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(
            format!("renaming kernel cache entry into {}", path.display()),
            e,
        )
    })
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
    if let Some(hit) = read_cache(&path, key) {
        DISK_HITS.fetch_add(1, Ordering::Relaxed);
        tracing::info!(module = module.name, arch, path = %path.display(), "kernel cache hit");
        return Ok(hit);
    }
    let start = Instant::now();
    let compiled = compile()?;
    let took = start.elapsed();
    COMPILES.fetch_add(1, Ordering::Relaxed);
    COMPILE_NANOS.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    tracing::info!(
        module = module.name,
        arch,
        "compiled in {:.3} s (NVRTC {}.{})",
        took.as_secs_f64(),
        nvrtc_version.0,
        nvrtc_version.1
    );
    if !compiled.log.is_empty() {
        tracing::debug!(module = module.name, arch, "NVRTC log:\n{}", compiled.log);
    }
    let (kind, image) = match compiled.cubin {
        Some(c) => (ImageKind::Cubin, c),
        None => {
            let mut ptx = compiled.ptx;
            if ptx.last() != Some(&0) {
                ptx.push(0);
            }
            (ImageKind::Ptx, ptx)
        }
    };
    if let Err(e) = write_cache(&path, key, kind, &image) {
        tracing::warn!("kernel cache not written (the kernel still loads): {e}");
    }
    Ok((kind, image))
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
}

/// The argument struct size of the kernels whose struct the HAL defines.
fn known_param_size(id: KernelId) -> Option<usize> {
    use mscclpp_hal::kernel::{
        AtomicAddU64Args, FillU32Args, MemoryChannelPutArgs, PortChannelPutArgs,
    };
    use std::mem::size_of;
    match id {
        KernelId::FILL_U32 => Some(size_of::<FillU32Args>()),
        KernelId::ATOMIC_ADD_U64 => Some(size_of::<AtomicAddU64Args>()),
        KernelId::BENCH_MEMORY_CHANNEL_PUT => Some(size_of::<MemoryChannelPutArgs>()),
        KernelId::BENCH_PORT_CHANNEL_PUT => Some(size_of::<PortChannelPutArgs>()),
        _ => None,
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
    check("cuModuleLoadData", r).map_err(|e| match e {
        Error::Driver {
            backend,
            call,
            code,
            message,
        } => Error::Driver {
            backend,
            call,
            code,
            message: format!("{message} (module {}, {kind:?} for {arch})", module.name),
        },
        other => other,
    })?;
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
