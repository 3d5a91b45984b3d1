//! `ncclSetEncryption` (NCCL 2.32): process-wide encryption of the library's TCP sockets.
//!
//! NCCL's header and documentation: a config with `NCCL_ENCRYPTION_MODE_PSK` asks for TLS with
//! the given pre-shared key on every socket NCCL owns, to be set before `ncclGetUniqueId`.
//! This library's TCP sockets are mscclpp's bootstrap (ids, addresses, the handshakes that
//! exchange memory handles), and the bootstrap has no TLS: it authenticates peers with the
//! id's secret but sends in plaintext. So plaintext (`NCCL_ENCRYPTION_MODE_NONE`) is served, and
//! a PSK is refused with `ncclInvalidUsage` naming what is missing, rather than accepted and
//! left unapplied (a caller would believe its traffic encrypted).

use std::ffi::c_char;

use crate::abi::*;
use crate::error::{Failure, guard};

/// `ncclResult_t ncclSetEncryption(const ncclEncryptionConfig_t* config)` (NCCL 2.32). The
/// config is checked as NCCL checks it (the magic; at most `size` bytes read; NULL is the
/// default, plaintext): `NCCL_ENCRYPTION_MODE_NONE` succeeds; `NCCL_ENCRYPTION_MODE_PSK` without
/// a key, or another mode, is `ncclInvalidArgument`; a key is `ncclInvalidUsage`, since this
/// library's bootstrap cannot encrypt.
///
/// # Safety
/// `config` is NULL or an `ncclEncryptionConfig_t` made with `NCCL_ENCRYPTION_CONFIG_INITIALIZER`
/// (its `size` bytes readable).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclSetEncryption(config: *const NcclEncryptionConfig) -> NcclResult {
    guard("ncclSetEncryption", || {
        if config.is_null() {
            return Ok(());
        }
        // SAFETY: every versioned struct starts with its size (caller's contract).
        let size = unsafe { config.cast::<usize>().read_unaligned() };
        let mut raw = NcclEncryptionConfig {
            size: 0,
            magic: 0,
            version: 0,
            mode: NCCL_ENCRYPTION_MODE_NONE,
            psk: std::ptr::null::<c_char>(),
        };
        let n = size.min(std::mem::size_of::<NcclEncryptionConfig>());
        // SAFETY: `n` bytes of the caller's struct (at most its size) into ours, which has room
        // for them; both are plain data.
        unsafe {
            std::ptr::copy_nonoverlapping(
                config.cast::<u8>(),
                (&mut raw as *mut NcclEncryptionConfig).cast::<u8>(),
                n,
            )
        };
        if raw.magic != NCCL_API_MAGIC {
            return Err(Failure::argument(format!(
                "config->magic {:#x} (size {size}), expected {NCCL_API_MAGIC:#x}: initialise it with NCCL_ENCRYPTION_CONFIG_INITIALIZER",
                raw.magic
            )));
        }
        match raw.mode {
            NCCL_ENCRYPTION_MODE_NONE => {
                tracing::info!(
                    target: crate::debug::INIT,
                    "ncclSetEncryption: NCCL_ENCRYPTION_MODE_NONE: the bootstrap's sockets stay plaintext"
                );
                Ok(())
            }
            NCCL_ENCRYPTION_MODE_PSK if raw.psk.is_null() => Err(Failure::argument(
                "NCCL_ENCRYPTION_MODE_PSK requires config->psk",
            )),
            NCCL_ENCRYPTION_MODE_PSK => Err(Failure::usage(
                "NCCL_ENCRYPTION_MODE_PSK is not supported: this library's TCP sockets are mscclpp's bootstrap, which has no TLS (it authenticates peers with the unique id's secret but sends in plaintext); keep the bootstrap on a trusted network, or use NCCL_ENCRYPTION_MODE_NONE",
            )),
            other => Err(Failure::argument(format!(
                "config->mode {other} is not an ncclEncryptionMode_t (NCCL_ENCRYPTION_MODE_NONE 0, NCCL_ENCRYPTION_MODE_PSK 1)"
            ))),
        }
    })
}
