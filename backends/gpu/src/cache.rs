//! The on-disk cache of compiled kernel modules (NVRTC cubins or PTX, hipRTC code objects):
//! keys, the entry format, atomic writes and counters.
//!
//! One file per (module, target, key), where the key is a 128-bit FNV-1a hash of the module's
//! source, every embedded header, the target, the compiler version and the options. A file holds
//! a 40-byte header (magic, version, image kind, key, length, checksum) and the image. Files are
//! written to a temporary name and renamed into place, so readers never see half a file; a
//! corrupt or unreadable entry is recompiled and rewritten, never fatal.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mscclpp_hal::{BackendKind, Error, Result};

use crate::runtime::{Compiled, Image, Vendor};

/// Header bytes: magic 4, version 2, kind 1, pad 1, key 16, length 8, checksum 8.
pub const ENTRY_HEADER: usize = 40;
/// Largest image accepted from the cache (a bound on what a corrupt file can make us read).
pub const MAX_IMAGE: u64 = 256 << 20;

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

/// The key of `name` (`source` plus `headers`) compiled for `target` by a compiler of `version`
/// with `options`; `domain` separates the backends' keys.
pub fn cache_key(
    domain: &str,
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    target: &str,
    version: (i32, i32),
    options: &str,
) -> u128 {
    let mut h = Fnv128::default();
    h.field(domain.as_bytes())
        .field(name.as_bytes())
        .field(source.as_bytes());
    for (n, c) in headers {
        h.field(n.as_bytes()).field(c.as_bytes());
    }
    h.field(target.as_bytes())
        .field(&version.0.to_le_bytes())
        .field(&version.1.to_le_bytes())
        .field(options.as_bytes());
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

/// A backend's entry format: its magic and version (a cubin is never read as a code object).
#[derive(Debug, Clone, Copy)]
pub struct EntryFormat {
    /// Four bytes that open every entry.
    pub magic: [u8; 4],
    /// Bumped when the layout or the meaning of the image changes.
    pub version: u16,
}

impl EntryFormat {
    /// Encodes an entry.
    pub fn encode(&self, key: u128, kind: u8, image: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENTRY_HEADER + image.len());
        out.extend_from_slice(&self.magic);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.push(kind);
        out.push(0);
        out.extend_from_slice(&key.to_le_bytes());
        out.extend_from_slice(&(image.len() as u64).to_le_bytes());
        out.extend_from_slice(&checksum(image).to_le_bytes());
        out.extend_from_slice(image);
        out
    }

    /// Decodes an entry, checking magic, version, key, length and checksum; returns the image
    /// kind byte and the image, or why the entry is unusable.
    pub fn decode(&self, bytes: &[u8], key: u128) -> std::result::Result<(u8, Vec<u8>), String> {
        let header = bytes
            .get(..ENTRY_HEADER)
            .ok_or_else(|| format!("truncated header ({} bytes)", bytes.len()))?;
        if header[..4] != self.magic {
            return Err("bad magic".into());
        }
        let version = u16::from_le_bytes([header[4], header[5]]);
        if version != self.version {
            return Err(format!("version {version}, expected {}", self.version));
        }
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&header[r]);
            u64::from_le_bytes(w)
        };
        let mut k = [0u8; 16];
        k.copy_from_slice(&header[8..24]);
        if u128::from_le_bytes(k) != key {
            return Err("key mismatch".into());
        }
        let (len, sum) = (word(24..32), word(32..40));
        let image = &bytes[ENTRY_HEADER..];
        if len > MAX_IMAGE || image.len() as u64 != len {
            return Err(format!(
                "length {len} disagrees with the {} bytes present",
                image.len()
            ));
        }
        if checksum(image) != sum {
            return Err("checksum mismatch".into());
        }
        Ok((header[6], image.to_vec()))
    }
}

/// How a backend's kernel modules were obtained so far in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Modules compiled (cache misses).
    pub compiles: u64,
    /// Modules read from the disk cache.
    pub disk_hits: u64,
    /// Total time spent compiling.
    pub compile_time: Duration,
    /// Cache entries that were present but unusable and were recompiled.
    pub corrupt_entries: u64,
}

/// The counters behind [`CacheStats`] (one static per backend).
#[derive(Debug, Default)]
pub struct CacheCounters {
    compiles: AtomicU64,
    disk_hits: AtomicU64,
    compile_nanos: AtomicU64,
    corrupt: AtomicU64,
}

impl CacheCounters {
    /// Zeroed counters.
    pub const fn new() -> Self {
        CacheCounters {
            compiles: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            compile_nanos: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
        }
    }

    /// A snapshot.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            compiles: self.compiles.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            compile_time: Duration::from_nanos(self.compile_nanos.load(Ordering::Relaxed)),
            corrupt_entries: self.corrupt.load(Ordering::Relaxed),
        }
    }

    /// Counts a cache hit.
    pub fn hit(&self) {
        self.disk_hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a compile that took `took`.
    pub fn compiled(&self, took: Duration) {
        self.compiles.fetch_add(1, Ordering::Relaxed);
        self.compile_nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// The flow both GPU backends run for a module: the cached image when `cached` finds a usable
/// entry (a hit, counted and logged), else `compile` — timed, counted and logged with the
/// compiler's own log — whose image `store` writes back (a failed write is only a warning: the
/// kernel still loads). `module`, `target` and `compiler` (e.g. `"NVRTC 13.0"`) name it in logs.
pub fn cached_or_compiled<T>(
    counters: &CacheCounters,
    (module, target, compiler): (&str, &str, &str),
    cached: impl FnOnce() -> Option<T>,
    compile: impl FnOnce() -> Result<(T, String)>,
    store: impl FnOnce(&T) -> Result<()>,
) -> Result<T> {
    if let Some(hit) = cached() {
        counters.hit();
        tracing::info!(module, target, "kernel cache hit");
        return Ok(hit);
    }
    let start = std::time::Instant::now();
    let (image, log) = compile()?;
    let took = start.elapsed();
    counters.compiled(took);
    tracing::info!(
        module,
        target,
        "compiled in {:.3} s ({compiler})",
        took.as_secs_f64()
    );
    if !log.is_empty() {
        tracing::debug!(module, target, "{compiler} log:\n{log}");
    }
    if let Err(e) = store(&image) {
        tracing::warn!("kernel cache not written (the kernel still loads): {e}");
    }
    Ok(image)
}

/// Reads and decodes the entry at `path`; `None` when missing, unreadable or unusable (logged and
/// counted, never fatal).
pub fn read_cache<T>(
    path: &Path,
    counters: &CacheCounters,
    decode: impl FnOnce(&[u8]) -> std::result::Result<T, String>,
) -> Option<T> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), "kernel cache entry unreadable, recompiling: {e}");
            counters.corrupt.fetch_add(1, Ordering::Relaxed);
            return None;
        }
    };
    match decode(&bytes) {
        Ok(v) => Some(v),
        Err(why) => {
            tracing::warn!(path = %path.display(), "kernel cache entry unusable ({why}), recompiling");
            counters.corrupt.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Writes `data` to `path` atomically (temporary file in the same directory, then rename).
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
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
    if let Err(e) = std::fs::write(&tmp, data) {
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

/// The counters of backend `kind` (one set per vendor, for [`cache_stats`]).
pub fn counters(kind: BackendKind) -> &'static CacheCounters {
    static CUDA: CacheCounters = CacheCounters::new();
    static ROCM: CacheCounters = CacheCounters::new();
    static OTHER: CacheCounters = CacheCounters::new();
    match kind {
        BackendKind::Cuda => &CUDA,
        BackendKind::Rocm => &ROCM,
        _ => &OTHER,
    }
}

/// How backend `kind`'s kernel modules were obtained so far in this process: "compiled in X s"
/// versus "cache hit".
pub fn cache_stats(kind: BackendKind) -> CacheStats {
    counters(kind).stats()
}

/// What names one compile in the cache: the module, the headers it sees, the target, the
/// compiler's version and the options.
#[derive(Debug, Clone, Copy)]
pub struct CompileKey<'a> {
    /// The module's name.
    pub name: &'a str,
    /// Its source.
    pub source: &'a str,
    /// The headers, as `(include name, contents)`.
    pub headers: &'a [(&'a str, &'a str)],
    /// The compile target.
    pub target: &'a str,
    /// The compiler's version.
    pub version: (i32, i32),
    /// The options besides the target.
    pub options: &'a str,
}

impl CompileKey<'_> {
    /// The cache key under `vendor`'s domain.
    pub fn key(&self, vendor: &Vendor) -> u128 {
        cache_key(
            vendor.cache_domain,
            self.name,
            self.source,
            self.headers,
            self.target,
            self.version,
            self.options,
        )
    }
}

fn entry_format(vendor: &Vendor) -> EntryFormat {
    EntryFormat {
        magic: vendor.cache_magic,
        version: 1,
    }
}

/// Decodes a cache entry of `vendor`; `Err` says why the entry is unusable.
pub fn decode_entry(
    vendor: &Vendor,
    bytes: &[u8],
    key: u128,
) -> std::result::Result<Image, String> {
    let (kind, bytes) = entry_format(vendor).decode(bytes, key)?;
    if !vendor.image_kinds.contains(&kind) {
        return Err(format!("unknown image kind {kind}"));
    }
    Ok(Image { kind, bytes })
}

/// How long a process waits for another's compile of the same entry before compiling it too.
pub const COMPILE_LOCK_WAIT: Duration = Duration::from_secs(600);

/// An exclusive lock on a cache entry's compile (`<entry>.lock`, an advisory file lock that the
/// kernel drops when its holder exits, so a crashed compiler cannot keep it). Best effort: a
/// directory that cannot hold the lock file, or a wait past `wait`, gives no lock (logged),
/// and the caller compiles anyway.
#[derive(Debug)]
pub struct CompileLock {
    _file: std::fs::File,
}

impl CompileLock {
    /// Takes the lock of the entry at `path`, waiting at most `wait` for another holder.
    pub fn take(path: &Path, wait: Duration) -> Option<CompileLock> {
        let lock = path.with_extension("lock");
        let opened = lock
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&lock)
            });
        let file = match opened {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(path = %lock.display(), "no kernel compile lock: {e}");
                return None;
            }
        };
        let start = std::time::Instant::now();
        let mut waited = false;
        loop {
            match try_flock(&file) {
                Ok(()) => {
                    if waited {
                        tracing::info!(
                            path = %lock.display(),
                            "waited {:.3} s for another process's compile",
                            start.elapsed().as_secs_f64()
                        );
                    }
                    return Some(CompileLock { _file: file });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && start.elapsed() < wait => {
                    waited = true;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    tracing::warn!(
                        path = %lock.display(),
                        "compiling without the kernel compile lock ({e}; waited {:.1} s)",
                        start.elapsed().as_secs_f64()
                    );
                    return None;
                }
            }
        }
    }
}

/// An exclusive, non-blocking `flock` of `file` (`File::try_lock` needs Rust 1.89, past this
/// workspace's minimum).
fn try_flock(file: &std::fs::File) -> std::io::Result<()> {
    rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .map_err(std::io::Error::from)
}

/// Encodes a cache entry of `vendor`.
pub fn encode_entry(vendor: &Vendor, key: u128, image: &Image) -> Vec<u8> {
    entry_format(vendor).encode(key, image.kind, &image.bytes)
}

/// Gets the image of `c` for `vendor`: from the cache under `dir`, else compiled by `compile`
/// (and cached). `compile` is a parameter so that tests can run without a compiler.
pub fn image_for(
    vendor: &Vendor,
    dir: &Path,
    c: CompileKey<'_>,
    compile: impl FnOnce() -> Result<Compiled>,
) -> Result<Image> {
    let key = c.key(vendor);
    let path = cache_path(dir, c.name, c.target, key);
    let counters = counters(vendor.kind);
    let compiler = format!("{} {}.{}", vendor.compiler, c.version.0, c.version.1);
    // Ranks sharing a machine miss the same entries at the same moment (on a fresh machine every
    // process compiled every module itself: docs/nccl.md): one compiles under the entry's lock
    // while the others wait, then read what it wrote.
    let _lock = (!path.exists()).then(|| CompileLock::take(&path, COMPILE_LOCK_WAIT));
    cached_or_compiled(
        counters,
        (c.name, c.target, &compiler),
        || read_cache(&path, counters, |b| decode_entry(vendor, b, key)),
        || compile().map(|c| (c.image, c.log)),
        |image| write_atomic(&path, &encode_entry(vendor, key, image)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::tests::TEST_VENDOR;
    use std::path::PathBuf;

    const V: Vendor = TEST_VENDOR;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "mscclpp-gpu-cache-test-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn compiled(kind: u8, tag: u8) -> Compiled {
        Compiled {
            image: Image {
                kind,
                bytes: vec![0x7f, b'E', b'L', b'F', tag],
            },
            log: String::new(),
            elapsed: Duration::ZERO,
        }
    }

    /// A module as the cache sees it: a name and a source.
    struct Module {
        name: &'static str,
        source: &'static str,
    }

    const MODULE: Module = Module {
        name: "collectives/ll.cu",
        source: "extern \"C\" __global__ void k() {}",
    };

    fn key<'a>(module: &'a Module, target: &'a str, version: (i32, i32)) -> CompileKey<'a> {
        CompileKey {
            name: module.name,
            source: module.source,
            headers: &[("a.cuh", "x")],
            target,
            version,
            options: "-std=c++17",
        }
    }

    #[test]
    fn key_depends_on_source_headers_target_version_options_and_domain() {
        let h = [("a.cuh", "x")];
        let k = |name, source, headers: &[(&str, &str)], target, version, options| {
            cache_key("d", name, source, headers, target, version, options)
        };
        let base = k("m.cu", "src", &h, "sm_90", (13, 0), "o");
        assert_eq!(base, k("m.cu", "src", &h, "sm_90", (13, 0), "o"));
        assert_ne!(base, k("m.cu", "src2", &h, "sm_90", (13, 0), "o"));
        assert_ne!(
            base,
            k("m.cu", "src", &[("a.cuh", "y")], "sm_90", (13, 0), "o")
        );
        assert_ne!(
            base,
            k("m.cu", "src", &[("b.cuh", "x")], "sm_90", (13, 0), "o")
        );
        assert_ne!(base, k("m.cu", "src", &h, "sm_80", (13, 0), "o"));
        assert_ne!(base, k("m.cu", "src", &h, "sm_90", (13, 1), "o"));
        assert_ne!(base, k("m.cu", "src", &h, "sm_90", (13, 0), "p"));
        assert_ne!(
            base,
            cache_key("e", "m.cu", "src", &h, "sm_90", (13, 0), "o")
        );
        // Field boundaries matter.
        assert_ne!(
            k("m.cu", "ab", &[("c", "")], "sm_90", (13, 0), "o"),
            k("m.cu", "a", &[("bc", "")], "sm_90", (13, 0), "o")
        );
    }

    #[test]
    fn entry_round_trips_and_rejects_corruption_and_unknown_kinds() {
        let image = Image {
            kind: 2,
            bytes: b"image bytes".to_vec(),
        };
        let e = encode_entry(&V, 42, &image);
        assert_eq!(&e[..4], &V.cache_magic);
        assert_eq!(decode_entry(&V, &e, 42).unwrap(), image);
        assert!(decode_entry(&V, &e, 43).unwrap_err().contains("key"));
        let mut bad = e.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(decode_entry(&V, &bad, 42).unwrap_err().contains("checksum"));
        let mut kind = e.clone();
        kind[6] = 9;
        assert!(decode_entry(&V, &kind, 42).unwrap_err().contains("kind"));
        assert!(decode_entry(&V, &e[..e.len() - 1], 42).is_err());
        assert!(decode_entry(&V, &e[..10], 42).is_err());
        assert!(decode_entry(&V, b"", 42).is_err());
    }

    #[test]
    fn miss_compiles_and_writes_then_hit_reads_and_corruption_recompiles() {
        let dir = temp_dir("flow");
        let module = &MODULE;
        let before = cache_stats(V.kind);
        let image = image_for(&V, &dir, key(module, "sm_90", (13, 0)), || {
            Ok(compiled(1, 1))
        });
        let image = image.unwrap();
        assert_eq!(image.bytes, vec![0x7f, b'E', b'L', b'F', 1]);
        // A hit must not call the compiler.
        let again = image_for(&V, &dir, key(module, "sm_90", (13, 0)), || {
            panic!("compiled although cached")
        })
        .unwrap();
        assert_eq!(again, image);
        // Another target and another compiler version are other entries.
        let other = image_for(&V, &dir, key(module, "sm_80", (13, 0)), || {
            Ok(compiled(2, 2))
        });
        assert_eq!(other.unwrap().bytes[4], 2);
        let newer = image_for(&V, &dir, key(module, "sm_90", (13, 1)), || {
            Ok(compiled(1, 4))
        });
        assert_eq!(newer.unwrap().bytes[4], 4);
        // Corrupt the first entry: it is recompiled and rewritten, not fatal.
        let k = key(module, "sm_90", (13, 0));
        let path = cache_path(&dir, module.name, "sm_90", k.key(&V));
        assert!(path.starts_with(&dir));
        std::fs::write(&path, b"garbage").unwrap();
        let fixed = image_for(&V, &dir, k, || Ok(compiled(1, 3))).unwrap();
        assert_eq!(fixed.bytes[4], 3);
        let counters = counters(V.kind);
        let read = read_cache(&path, counters, |b| decode_entry(&V, b, k.key(&V)));
        assert_eq!(read.unwrap().bytes[4], 3);
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let after = cache_stats(V.kind);
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
        let module = &MODULE;
        let image = image_for(&V, &dir, key(module, "gfx908", (5, 2)), || {
            Ok(compiled(1, 5))
        });
        assert_eq!(image.unwrap().bytes[4], 5);
        let _ = std::fs::remove_file(&dir);

        let dir = temp_dir("err");
        let e = image_for(&V, &dir, key(module, "gfx90a", (5, 2)), || {
            Err(Error::unavailable("TESTRTC", "not installed"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("TESTRTC"), "{e}");
        // No entry is written (the compile lock's file may stay: it holds nothing).
        let entries: Vec<_> = std::fs::read_dir(&dir)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(
            entries
                .iter()
                .all(|p| p.extension().is_some_and(|x| x == "lock")),
            "{entries:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ranks_that_miss_at_once_compile_once() {
        // Four "processes" (threads with their own lock files open: flock locks conflict
        // between open files) miss the same entry together; one compiles, the rest wait for
        // its lock and read its entry.
        let dir = temp_dir("together");
        let compiles = std::sync::atomic::AtomicUsize::new(0);
        let start = std::sync::Barrier::new(4);
        let images: Vec<Image> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        image_for(&V, &dir, key(&MODULE, "sm_90", (13, 0)), || {
                            compiles.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(300));
                            Ok(compiled(1, 7))
                        })
                        .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(compiles.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(images.iter().all(|i| i.bytes[4] == 7), "{images:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_held_lock_is_waited_for_at_most_the_wait() {
        let dir = temp_dir("held");
        let path = cache_path(&dir, "m.cu", "sm_90", 1);
        let held = CompileLock::take(&path, Duration::from_secs(1)).expect("first lock");
        let t = std::time::Instant::now();
        assert!(CompileLock::take(&path, Duration::from_millis(100)).is_none());
        assert!(t.elapsed() >= Duration::from_millis(100));
        drop(held);
        assert!(CompileLock::take(&path, Duration::from_millis(100)).is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
