//! # mscclpp-cuda — the NVIDIA backend
//!
//! Opens the CUDA driver at run time (no CUDA SDK at build time). In this version the backend
//! probes the driver — library, version, device count — and reports itself **not available**
//! with that finding: the device, memory, stream, IPC and kernel implementations arrive with the
//! CUDA-backend issue. Callers fall back to the next backend in the registry.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod driver;
pub mod kernels;
pub mod nvrtc;

use std::sync::Arc;

use mscclpp_hal::{Backend, Error, Result};

/// Probes for a usable CUDA driver and devices.
pub fn probe() -> Result<Arc<dyn Backend>> {
    let info = driver::probe_driver()?;
    if info.devices <= 0 {
        return Err(Error::unavailable(
            "cuda backend",
            format!(
                "CUDA driver {} found but it reports no devices",
                driver::format_version(info.version)
            ),
        ));
    }
    Err(Error::unavailable(
        "cuda backend",
        format!(
            "CUDA driver {} with {} device(s) found, but this build's CUDA backend is not implemented yet",
            driver::format_version(info.version),
            info.devices
        ),
    ))
}
