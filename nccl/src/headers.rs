//! Which NCCL headers a client compiled with, where what it hands over does not say.
//!
//! Since 2.29 the device API's structures carry `NCCL_API_MAGIC` and the client's
//! `NCCL_VERSION_CODE`. NCCL 2.28's carry neither, and its releases lay them out two ways
//! (2.28.3; 2.28.7 to 2.28.9), so a 2.28 client's version is learnt elsewhere, once per process:
//! - `MSCCLPP_NCCL_VERSION` (`2.28.3` or `22803`): what `ncclGetVersion` reports and which
//!   headers unversioned structures follow. nccl-tests built against 2.28 refuses its device
//!   implementations (`-D`) on a library newer than 2.28, as it would on NCCL 2.29+; with the
//!   variable set to the release it was built against, it runs them on this library.
//! - Else the `version` of the `ncclConfig_t` the communicator was made with
//!   (`NCCL_CONFIG_INITIALIZER` writes the headers' `NCCL_VERSION_CODE` there; PyTorch and
//!   nccl-tests make every communicator with one), or, for the `*CreateRequirement` calls, which
//!   name no communicator, of the last one read.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::abi::NCCL_VERSION_CODE;
use crate::devapi::layout::{DevCommLayout, version_name};
use crate::error::{Failure, Res};

/// The variable naming the NCCL release this library presents itself as.
pub const VERSION_VAR: &str = "MSCCLPP_NCCL_VERSION";

/// The `version` of the last `ncclConfig_t` read (0: none yet).
static CONFIG_VERSION: AtomicU32 = AtomicU32::new(0);

/// Records the `version` of an `ncclConfig_t` a communicator is made with.
pub fn note_config(version: u32) {
    CONFIG_VERSION.store(version, Ordering::Relaxed);
}

/// `MSCCLPP_NCCL_VERSION`, read and checked once: a release whose device API this library lays
/// out (2.28.3, 2.28.7 to 2.32.6), or why not.
fn declared() -> Res<Option<u32>> {
    static DECLARED: OnceLock<Result<Option<u32>, String>> = OnceLock::new();
    DECLARED
        .get_or_init(|| {
            let Some(v) = mscclpp::hal::env::get(VERSION_VAR) else {
                return Ok(None);
            };
            let code = parse(v.trim()).ok_or_else(|| {
                format!("{VERSION_VAR}={v:?}: expected a release such as 2.28.3 or its code 22803")
            })?;
            DevCommLayout::of(code)
                .map(|_| Some(code))
                .map_err(|e| format!("{VERSION_VAR}={v:?}: {e}"))
        })
        .clone()
        .map_err(Failure::argument)
}

/// `2.28.3` or `22803` as 22803.
fn parse(v: &str) -> Option<u32> {
    let parts: Vec<&str> = v.split('.').collect();
    match parts.as_slice() {
        [code] => code.parse().ok(),
        [major, minor, patch] => {
            let (a, b, c): (u32, u32, u32) = (
                major.parse().ok()?,
                minor.parse().ok()?,
                patch.parse().ok()?,
            );
            (a < 100 && b < 100 && c < 100).then(|| a * 10000 + b * 100 + c)
        }
        _ => None,
    }
}

/// What `ncclGetVersion` reports: `MSCCLPP_NCCL_VERSION` where set, else this library's.
pub fn reported() -> Res<u32> {
    Ok(declared()?.unwrap_or(NCCL_VERSION_CODE as u32))
}

/// The 2.28 release whose headers an unversioned device-API structure follows, or why it is
/// not known. `own`: the `version` of the communicator's `ncclConfig_t` (None: made without
/// one, or no communicator is named); else the last `ncclConfig_t` read decides.
pub fn unversioned(own: Option<u32>) -> Res<u32> {
    let is_228 = |v: u32| (22800..22900).contains(&v);
    if let Some(v) = declared()? {
        return if is_228(v) {
            Ok(v)
        } else {
            Err(Failure::usage(format!(
                "an unversioned device-API structure (NCCL 2.28's headers, or one made without its \
                 NCCL_*_INITIALIZER) while {VERSION_VAR} says the client's headers are NCCL {}",
                version_name(v)
            )))
        };
    }
    let config = own.unwrap_or_else(|| CONFIG_VERSION.load(Ordering::Relaxed));
    if is_228(config) {
        DevCommLayout::of(config).map_err(Failure::usage)?;
        return Ok(config);
    }
    Err(Failure::usage(format!(
        "an unversioned device-API structure: made without NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER, \
         or by a client built against NCCL 2.28's headers, whose releases lay it out two ways \
         (2.28.3; 2.28.7 to 2.28.9) and which nothing here names{}: make the communicator with an \
         ncclConfig_t (NCCL_CONFIG_INITIALIZER records the headers' release) or set {VERSION_VAR} \
         to the release (e.g. 2.28.3)",
        if config != 0 {
            format!(
                " (the last ncclConfig_t says NCCL {})",
                version_name(config)
            )
        } else {
            String::new()
        }
    )))
}

/// Bytes of an `ncclDevResourceRequirements` the client declared: 32 for a client of 2.28.3
/// (no GIN fields), else 56. A malformed `MSCCLPP_NCCL_VERSION` is an error. Where nothing names
/// the release (no variable, no `ncclConfig_t` read) the struct is taken as 56 bytes, every
/// release's size but 2.28.3's: the struct itself says nothing, and refusing would refuse
/// clients of 2.29 on that NCCL serves. A client of 2.28.3 that makes its communicators without
/// a config sets the variable (docs/nccl.md).
pub fn resource_requirement_bytes() -> Res<usize> {
    declared()?;
    Ok(match unversioned(None) {
        Ok(v) if v < 22807 => crate::devapi::layout::reqs228::RESOURCE_BYTES_22803,
        _ => crate::devapi::layout::reqs::resource::BYTES,
    })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn releases_and_codes_parse() {
        assert_eq!(parse("2.28.3"), Some(22803));
        assert_eq!(parse("22809"), Some(22809));
        assert_eq!(parse("2.32.6"), Some(23206));
        assert_eq!(parse("2.28"), None);
        assert_eq!(parse("2.x.3"), None);
        assert_eq!(parse("2.1000.3"), None);
        assert_eq!(
            parse("4294967.28.3"),
            None,
            "a major past 99 would overflow the code"
        );
    }
}
