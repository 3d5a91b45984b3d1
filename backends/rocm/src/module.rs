//! Kernel modules of the ROCm backend: compiled from the embedded sources with hipRTC for the
//! device's gfx processor on first use, cached on disk, loaded once per device.
//!
//! **Cache** (the same design as the CUDA backend's; the code is kept here rather than moved into
//! a shared crate for now — sharing it is a later refactor across crates). Under
//! `<MSCCLPP_CACHE_DIR>/rocm/`, one file per (module, target, key), where the key is a 128-bit
//! FNV-1a hash of the module's source, every embedded header (names and contents), the compile
//! target, the hipRTC version and the compile options. A file holds a 40-byte header (magic
//! `MSKR`, version, kind, key, length, checksum) and the code object. Files are written to a
//! temporary name and renamed into place, so readers never see half a file; a corrupt or
//! unreadable entry is recompiled and rewritten, never fatal.
//!
//! **Target.** The device reports a target id such as `gfx90a:sramecc+:xnack-`; modules are
//! compiled for its processor alone (`gfx90a`, see [`crate::device::compile_target`]), whose
//! code object the loader accepts whatever the device's SRAMECC/XNACK settings.

use std::collections::HashMap;
use std::ffi::{CString, c_int};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, Kernel, KernelId, Result};

use crate::device::{DeviceCtx, compile_target};
use crate::ffi::{self, HipFunction, HipModule};
use crate::hiprtc;
use crate::kernels::{self, HEADERS, Module};

const CACHE_MAGIC: [u8; 4] = *b"MSKR";
const CACHE_VERSION: u16 = 1;
/// The one image kind: an AMDGPU code object (ELF) for `hipModuleLoadData`.
const KIND_CODE_OBJECT: u8 = 1;
/// Header bytes: magic 4, version 2, kind 1, pad 1, key 16, length 8, checksum 8.
const CACHE_HEADER: usize = 40;
/// Largest image accepted from the cache (a bound on what a corrupt file can make us read).
const MAX_IMAGE: u64 = 256 << 20;

/// Counters of kernel-module loads in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Modules compiled by hipRTC (cache misses).
    pub compiles: u64,
    /// Modules read from the disk cache.
    pub disk_hits: u64,
    /// Total time spent in hipRTC.
    pub compile_time: Duration,
    /// Cache entries that were present but unusable (corrupt, wrong key) and were recompiled.
    pub corrupt_entries: u64,
}

static COMPILES: AtomicU64 = AtomicU64::new(0);
static DISK_HITS: AtomicU64 = AtomicU64::new(0);
static COMPILE_NANOS: AtomicU64 = AtomicU64::new(0);
static CORRUPT: AtomicU64 = AtomicU64::new(0);

/// How this process's kernel modules were obtained so far.
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
    let mut h = Fnv128::default();
    h.field(b"mscclpp-rocm kernel cache v1")
        .field(name.as_bytes())
        .field(source.as_bytes());
    for (n, c) in headers {
        h.field(n.as_bytes()).field(c.as_bytes());
    }
    h.field(target.as_bytes())
        .field(&version.0.to_le_bytes())
        .field(&version.1.to_le_bytes())
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

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The file that holds the entry for (module, target, key) under `dir`.
pub fn cache_path(dir: &Path, module: &str, target: &str, key: u128) -> PathBuf {
    dir.join(format!(
        "{}-{}-{key:032x}.bin",
        sanitize(module),
        sanitize(target)
    ))
}

/// Encodes a cache entry.
pub fn encode_entry(key: u128, image: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(CACHE_HEADER + image.len());
    out.extend_from_slice(&CACHE_MAGIC);
    out.extend_from_slice(&CACHE_VERSION.to_le_bytes());
    out.push(KIND_CODE_OBJECT);
    out.push(0);
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&(image.len() as u64).to_le_bytes());
    out.extend_from_slice(&checksum(image).to_le_bytes());
    out.extend_from_slice(image);
    out
}

/// Decodes a cache entry, checking magic, version, kind, key, length and checksum; `Err` says
/// why the entry is unusable.
pub fn decode_entry(bytes: &[u8], key: u128) -> std::result::Result<Vec<u8>, String> {
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
    if header[6] != KIND_CODE_OBJECT {
        return Err(format!("unknown image kind {}", header[6]));
    }
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
    Ok(image.to_vec())
}

/// Reads a usable entry, or `None` (missing, unreadable or corrupt — logged, never fatal).
pub fn read_cache(path: &Path, key: u128) -> Option<Vec<u8>> {
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
pub fn write_cache(path: &Path, key: u128, image: &[u8]) -> Result<()> {
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
    let data = encode_entry(key, image);
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
    if let Some(hit) = read_cache(&path, key) {
        DISK_HITS.fetch_add(1, Ordering::Relaxed);
        tracing::info!(module = module.name, target, path = %path.display(), "kernel cache hit");
        return Ok(hit);
    }
    let start = Instant::now();
    let compiled = compile()?;
    let took = start.elapsed();
    COMPILES.fetch_add(1, Ordering::Relaxed);
    COMPILE_NANOS.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    tracing::info!(
        module = module.name,
        target,
        "compiled in {:.3} s (hipRTC {}.{})",
        took.as_secs_f64(),
        version.0,
        version.1
    );
    if !compiled.log.is_empty() {
        tracing::debug!(
            module = module.name,
            target,
            "hipRTC log:\n{}",
            compiled.log
        );
    }
    if let Err(e) = write_cache(&path, key, &compiled.code) {
        tracing::warn!("kernel cache not written (the kernel still loads): {e}");
    }
    Ok(compiled.code)
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
        ffi::with_context(e, || {
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
