//! # mscclpp-rocm — the AMD backend
//!
//! Opens the HIP runtime (`libamdhip64`) at run time (no ROCm SDK at build time; the `hip-sys`
//! crate is not used because it links libamdhip64 and needs ROCm headers at build time). In this version the backend
//! probes the runtime — library, version, device count — and reports itself **not available**
//! with that finding: the device, memory, stream, IPC and kernel implementations arrive with the
//! ROCm-backend issue. Callers fall back to the next backend in the registry.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod hiprtc;
pub mod kernels;
pub mod runtime;

use std::sync::Arc;

use mscclpp_hal::{Backend, Error, Result};

/// Probes for a usable HIP runtime and devices.
pub fn probe() -> Result<Arc<dyn Backend>> {
    let info = runtime::probe_driver()?;
    if info.devices <= 0 {
        return Err(Error::unavailable(
            "rocm backend",
            format!(
                "HIP runtime {} found but it reports no devices",
                runtime::format_version(info.version)
            ),
        ));
    }
    Err(Error::unavailable(
        "rocm backend",
        format!(
            "HIP runtime {} with {} device(s) found, but this build's ROCm backend is not implemented yet",
            runtime::format_version(info.version),
            info.devices
        ),
    ))
}
