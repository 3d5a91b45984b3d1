//! The on-disk cache of compiled kernel modules, shared by the GPU backends (NVRTC cubins, hipRTC
//! code objects): keys, the entry format, atomic writes and counters.
//!
//! One file per (module, target, key), where the key is a 128-bit FNV-1a hash of the module's
//! source, every embedded header, the target, the compiler version and the options. A file holds
//! a 40-byte header (magic, version, image kind, key, length, checksum) and the image. Files are
//! written to a temporary name and renamed into place, so readers never see half a file; a
//! corrupt or unreadable entry is recompiled and rewritten, never fatal.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};

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
