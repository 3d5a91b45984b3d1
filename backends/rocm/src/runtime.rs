//! The probe: opens the HIP runtime ([`crate::ffi::api`]), initialises it and counts devices.
//!
//! Every missing piece — the library, a symbol, a GPU — is an [`Error::Unavailable`] naming
//! what was tried and what was found, never a panic. On a machine with ROCm's runtime but no
//! AMD GPU (this repository's build machines: Debian's ROCm 5.2) `hipInit` fails with
//! `hipErrorInvalidDevice` (101); ROCm 5.7+ answers `hipErrorNoDevice` (100).

use mscclpp_hal::{Error, Result};

use crate::ffi::{self, Api};

pub use crate::ffi::LIBRARY_NAMES;

/// What the probe found in a working runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverInfo {
    /// `hipDriverGetVersion`, e.g. 50221153 for HIP 5.2.21153.
    pub version: i32,
    /// `hipRuntimeGetVersion`.
    pub runtime_version: i32,
    /// `hipGetDeviceCount`.
    pub devices: i32,
}

fn unavailable(reason: String) -> Error {
    Error::unavailable("rocm backend", reason)
}

/// Opens the runtime, initialises it and counts devices.
pub fn probe_driver() -> Result<DriverInfo> {
    probe_with(ffi::api()?)
}

/// [`probe_driver`] over an already opened runtime.
pub fn probe_with(api: &Api) -> Result<DriverInfo> {
    let mut version = 0i32;
    // SAFETY: valid out-pointer to a local; callable before hipInit.
    api.check("hipDriverGetVersion", unsafe {
        (api.driver_get_version)(&mut version)
    })
    .map_err(|e| unavailable(format!("{} opened but {e}", api.library)))?;
    // SAFETY: hipInit takes flags that must be 0.
    api.check("hipInit", unsafe { (api.init)(0) })
        .map_err(|e| {
            unavailable(format!(
                "HIP runtime {} ({}) present but {e}",
                format_version(version),
                api.library
            ))
        })?;
    let mut runtime_version = 0i32;
    // SAFETY: valid out-pointer to a local.
    api.check("hipRuntimeGetVersion", unsafe {
        (api.runtime_get_version)(&mut runtime_version)
    })?;
    let mut devices = 0i32;
    // SAFETY: valid out-pointer to a local.
    let r = unsafe { (api.get_device_count)(&mut devices) };
    if r == ffi::code::NO_DEVICE {
        devices = 0;
    } else {
        api.check("hipGetDeviceCount", r)?;
    }
    Ok(DriverInfo {
        version,
        runtime_version,
        devices,
    })
}

/// `50221153` → `"5.2.21153"` (HIP encodes major * 10^7 + minor * 10^5 + patch).
pub fn format_version(v: i32) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

/// The major version of an encoded HIP version (`60032830` → 6).
pub fn major(v: i32) -> i32 {
    v / 10_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_format() {
        assert_eq!(format_version(50221153), "5.2.21153");
        assert_eq!(format_version(60032830), "6.0.32830");
        assert_eq!(major(60032830), 6);
        assert_eq!(major(50221153), 5);
    }
}
