//! `ncclConfig_t`: the parts of it this library keeps ([`CommConfig`]) and how a caller's
//! struct is read ([`parse_config`]).

use std::ffi::{c_char, c_int, c_void};

use crate::abi::*;
use crate::error::{Failure, Res};

/// The parts of an `ncclConfig_t` this library keeps (a split or shrink without a config
/// inherits them from the parent, as NCCL does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommConfig {
    /// `blocking` (default 1; `NCCL_COMM_BLOCKING` overrides it, as in NCCL).
    pub blocking: bool,
    /// `cgaClusterSize`, `minCTAs`, `maxCTAs`: recorded and logged; mscclpp's algorithms size
    /// their own grids.
    pub ctas: [Option<c_int>; 3],
    /// `netName`: recorded; the bootstrap and transports are this library's own.
    pub net_name: Option<String>,
    /// `commName`: names the communicator in logs.
    pub comm_name: Option<String>,
    /// `splitShare`, `shrinkShare`: a child never shares the parent's buffers here (it gets
    /// its own scratch), which NCCL permits: sharing is a hint.
    pub share: [bool; 2],
    /// `version`: the `NCCL_VERSION_CODE` of the headers the client compiled with (None: no
    /// config), which tells a client of NCCL 2.28 which layout its device-API structures have
    /// ([`crate::headers`]).
    pub headers: Option<u32>,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            blocking: true,
            ctas: [None; 3],
            net_name: None,
            comm_name: None,
            share: [false; 2],
            headers: None,
        }
    }
}

/// Reads at most 256 bytes of a C string (a name in a config).
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string (or at least 256 readable bytes).
unsafe fn name(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    let mut bytes = Vec::new();
    for i in 0..256 {
        // SAFETY: within the string or its first 256 bytes (caller's contract).
        let b = unsafe { p.add(i).read() } as u8;
        if b == 0 {
            break;
        }
        bytes.push(b);
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

fn set(v: c_int) -> Option<c_int> {
    (v != NCCL_CONFIG_UNDEF_INT).then_some(v)
}

/// `NCCL_COMM_BLOCKING`: 0 or 1 overrides every config's `blocking`, as it does in NCCL.
fn env_blocking() -> Res<Option<bool>> {
    const VAR: &str = "NCCL_COMM_BLOCKING";
    match mscclpp::hal::env::get(VAR) {
        None => Ok(None),
        Some(v) => match v.trim() {
            "0" => Ok(Some(false)),
            "1" => Ok(Some(true)),
            other => Err(Failure::argument(format!(
                "{VAR}={other:?}: expected 0 (non-blocking) or 1 (blocking)"
            ))),
        },
    }
}

/// Reads a caller's `ncclConfig_t` as NCCL does: `size` bytes of it at most (a newer, longer
/// struct is read as far as this library knows it), the magic checked, and the fields a
/// `version` older than the one that added them is treated as unset. NULL: `inherit` (a split
/// or shrink without a config), else the defaults.
///
/// # Safety
/// `config` must be NULL or point to `size` readable bytes starting with an `ncclConfig_t`
/// header, whose name pointers are NULL or C strings.
pub unsafe fn parse_config(config: *const c_void, inherit: Option<&CommConfig>) -> Res<CommConfig> {
    let mut c = if config.is_null() {
        inherit.cloned().unwrap_or_default()
    } else {
        // SAFETY: every ncclConfig_t starts with its size (caller's contract).
        let size = unsafe { config.cast::<usize>().read_unaligned() };
        let mut raw = NcclConfig::INITIALIZER;
        raw.magic = 0;
        let n = size.min(std::mem::size_of::<NcclConfig>());
        // SAFETY: `n` bytes of the caller's struct (at most its size) into ours, which has room
        // for them; both are plain data.
        unsafe {
            std::ptr::copy_nonoverlapping(
                config.cast::<u8>(),
                (&mut raw as *mut NcclConfig).cast::<u8>(),
                n,
            )
        };
        if raw.magic != NCCL_CONFIG_MAGIC {
            return Err(Failure::argument(format!(
                "ncclConfig_t at {config:p} (size {size}) has magic {:#x}, expected {NCCL_CONFIG_MAGIC:#x}: initialise it with NCCL_CONFIG_INITIALIZER",
                raw.magic
            )));
        }
        crate::headers::note_config(raw.version);
        let d = NcclConfig::INITIALIZER;
        if raw.version < 21400 {
            raw.blocking = d.blocking;
        }
        if raw.version < 21700 {
            raw.cga_cluster_size = d.cga_cluster_size;
            raw.min_ctas = d.min_ctas;
            raw.max_ctas = d.max_ctas;
            raw.net_name = d.net_name;
        }
        if raw.version < 21800 {
            raw.split_share = d.split_share;
        }
        let blocking = match raw.blocking {
            NCCL_CONFIG_UNDEF_INT | 1 => true,
            0 => false,
            other => {
                tracing::warn!(
                    target: crate::debug::LIFECYCLE_MODULE,
                    "ncclConfig_t.blocking {other} is not 0 or 1; using 1"
                );
                true
            }
        };
        let c = CommConfig {
            blocking,
            ctas: [
                set(raw.cga_cluster_size),
                set(raw.min_ctas),
                set(raw.max_ctas),
            ],
            // SAFETY: name pointers of the caller's config (contract).
            net_name: unsafe { name(raw.net_name) },
            // SAFETY: as above.
            comm_name: unsafe { name(raw.comm_name) },
            share: [raw.split_share == 1, raw.shrink_share == 1],
            headers: Some(raw.version),
        };
        tracing::debug!(
            target: crate::debug::LIFECYCLE_MODULE,
            size,
            version = raw.version,
            config = ?c,
            "ncclConfig_t read (CTA counts and netName are recorded, not applied)"
        );
        c
    };
    if let Some(b) = env_blocking()? {
        c.blocking = b;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_versions_and_sizes() {
        let mut raw = NcclConfig::INITIALIZER;
        raw.blocking = 0;
        raw.max_ctas = 4;
        let comm_name = c"pg-7";
        raw.comm_name = comm_name.as_ptr();
        // SAFETY: a full, initialised config.
        let c = unsafe { parse_config((&raw as *const NcclConfig).cast(), None) }.unwrap();
        assert!(!c.blocking);
        assert_eq!(c.ctas, [None, None, Some(4)]);
        assert_eq!(c.comm_name.as_deref(), Some("pg-7"));

        // A 2.13 caller knew no `blocking`: its value is ignored.
        let mut old = raw;
        old.version = 21300;
        // SAFETY: as above.
        let c = unsafe { parse_config((&old as *const NcclConfig).cast(), None) }.unwrap();
        assert!(c.blocking);

        // A struct of only the header and `blocking`: nothing beyond is read.
        let mut short = raw;
        short.size = 20;
        short.comm_name = 0x10 as *const c_char;
        // SAFETY: only 20 bytes are read, and the name pointer is past them.
        let c = unsafe { parse_config((&short as *const NcclConfig).cast(), None) }.unwrap();
        assert!(!c.blocking);
        assert_eq!(c.comm_name, None);
        assert_eq!(c.ctas, [None; 3]);

        // No magic (too short to hold it, or not initialised).
        let mut bad = raw;
        bad.size = 8;
        // SAFETY: as above.
        let e = unsafe { parse_config((&bad as *const NcclConfig).cast(), None) }.unwrap_err();
        assert_eq!(e.code, NCCL_INVALID_ARGUMENT);
        bad.size = 80;
        bad.magic = 7;
        // SAFETY: as above.
        let e = unsafe { parse_config((&bad as *const NcclConfig).cast(), None) }.unwrap_err();
        assert!(
            e.message.contains("NCCL_CONFIG_INITIALIZER"),
            "{}",
            e.message
        );

        // A caller built with 2.32's header (ncclConfig_v23100, 120 bytes) and one built with
        // 2.28's (80 bytes) are both read; so is a longer struct of a newer NCCL, as far as
        // this library knows it.
        assert_eq!(raw.size, 120);
        let mut v228 = raw;
        v228.size = 80;
        v228.version = 22803;
        // SAFETY: 80 bytes of a whole config.
        let c = unsafe { parse_config((&v228 as *const NcclConfig).cast(), None) }.unwrap();
        assert!(!c.blocking);
        assert_eq!(c.comm_name.as_deref(), Some("pg-7"));
        let mut newer = [0u8; 200];
        // SAFETY: `raw` is plain data of 120 bytes; `newer` has room for it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&raw as *const NcclConfig).cast::<u8>(),
                newer.as_mut_ptr(),
                std::mem::size_of::<NcclConfig>(),
            )
        };
        newer[..8].copy_from_slice(&200usize.to_ne_bytes());
        // SAFETY: 200 readable bytes starting with a config header.
        let c = unsafe { parse_config(newer.as_ptr().cast(), None) }.unwrap();
        assert_eq!(c.ctas, [None, None, Some(4)]);

        // NULL inherits.
        let parent = CommConfig {
            blocking: false,
            ..CommConfig::default()
        };
        // SAFETY: NULL.
        let c = unsafe { parse_config(std::ptr::null(), Some(&parent)) }.unwrap();
        assert_eq!(c, parent);
    }
}
