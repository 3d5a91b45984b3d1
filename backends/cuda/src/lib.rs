//! # mscclpp-cuda — the NVIDIA backend
//!
//! The CUDA driver as a [`mscclpp_gpu::Runtime`] table ([`runtime`]): everything a GPU backend
//! does is written once in `mscclpp-gpu`; this crate is the driver's raw calls, the probe that
//! makes them safe to reach, and NVRTC's names ([`nvrtc`]).
//!
//! The driver is opened at run time (cudarc with `dynamic-loading`; no CUDA SDK at build time).
//! A machine without NVIDIA software gets `Unavailable` from [`probe`], never a panic: cudarc
//! panics when the library or a symbol is missing, so the probe opens the driver itself first
//! ([`driver::probe_driver`]), refuses drivers older than CUDA 12.0, and checks that every entry
//! point the runtime table calls is present ([`driver::REQUIRED_SYMBOLS`]) before anything goes
//! through cudarc. Multicast is guarded in `mscclpp-gpu` and never calls the driver.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod driver;
pub mod nvrtc;
pub mod runtime;
mod vmm;

pub use runtime::{CudaRuntime, DriverFeatures};

use std::sync::{Arc, OnceLock};

use mscclpp_hal::{Backend, Error, Result};

/// The NVIDIA backend.
pub type CudaBackend = mscclpp_gpu::GpuBackend<CudaRuntime>;
/// The CUDA backend's family of types ([`mscclpp_hal::Api`]), for code generic over a backend.
pub type Cuda = mscclpp_gpu::Gpu<CudaRuntime>;
/// An opened NVIDIA device.
pub type CudaDevice = mscclpp_gpu::GpuDevice<CudaRuntime>;
/// A stream of the NVIDIA backend.
pub type CudaStream = mscclpp_gpu::GpuStream<CudaRuntime>;
/// An event of the NVIDIA backend.
pub type CudaEvent = mscclpp_gpu::GpuEvent<CudaRuntime>;
/// An allocation of the NVIDIA backend.
pub type CudaAllocation = mscclpp_gpu::GpuAllocation<CudaRuntime>;
/// A kernel of the NVIDIA backend.
pub type CudaKernel = mscclpp_gpu::GpuKernel<CudaRuntime>;

/// How this process's CUDA kernel modules were obtained so far.
pub fn cache_stats() -> mscclpp_gpu::CacheStats {
    mscclpp_gpu::cache_stats(mscclpp_hal::BackendKind::Cuda)
}

fn unavailable(reason: String) -> Error {
    Error::unavailable("cuda backend", reason)
}

/// Probes for a usable CUDA driver (12.0 or newer, with every entry point this backend uses)
/// and devices; opens the backend over it.
pub fn probe() -> Result<Arc<dyn Backend>> {
    Ok(probe_cuda()?)
}

/// The runtime table, made once the driver passed every check of [`probe_cuda`].
/// A failed probe is not remembered: the next one looks again.
fn runtime() -> Result<&'static CudaRuntime> {
    static RUNTIME: OnceLock<CudaRuntime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = open_runtime()?;
    Ok(RUNTIME.get_or_init(|| rt))
}

fn open_runtime() -> Result<CudaRuntime> {
    let info = driver::probe_driver()?;
    let version = driver::format_version(info.version);
    if info.version < driver::MIN_DRIVER_VERSION {
        return Err(unavailable(format!(
            "CUDA driver {version} is too old: this backend needs CUDA {} or newer",
            driver::format_version(driver::MIN_DRIVER_VERSION)
        )));
    }
    if info.devices <= 0 {
        return Err(unavailable(format!(
            "CUDA driver {version} found but it reports no devices"
        )));
    }
    let missing = driver::missing_symbols(driver::REQUIRED_SYMBOLS)?;
    if !missing.is_empty() {
        return Err(unavailable(format!(
            "CUDA driver {version} lacks entry points this backend needs: {}",
            missing.join(", ")
        )));
    }
    Ok(CudaRuntime {
        driver_version: info.version,
        features: DriverFeatures {
            elapsed_time_v2: driver::has_symbol(driver::optional::EVENT_ELAPSED_TIME_V2),
            elapsed_time_v1: driver::has_symbol(driver::optional::EVENT_ELAPSED_TIME_V1),
            func_param_info: driver::has_symbol(driver::optional::FUNC_GET_PARAM_INFO),
            multicast_symbols: driver::missing_symbols(driver::optional::MULTICAST)
                .is_ok_and(|m| m.is_empty()),
        },
    })
}

/// [`probe`], returning the concrete type.
pub fn probe_cuda() -> Result<Arc<CudaBackend>> {
    let rt = runtime()?;
    let backend = CudaBackend::open(rt).map_err(|e| {
        unavailable(format!(
            "CUDA driver {} found, but enumerating its devices failed: {e}",
            driver::format_version(rt.driver_version)
        ))
    })?;
    tracing::info!("{}", mscclpp_hal::Backend::describe(&backend));
    Ok(Arc::new(backend))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mscclpp_hal::ErrorClass;

    /// On a machine without NVIDIA software (CI, this repository's build machines) the probe
    /// answers `Unavailable` with the reason, and never panics. On a GPU machine it succeeds.
    #[test]
    fn probe_never_panics() {
        match std::panic::catch_unwind(probe) {
            Ok(Ok(b)) => assert!(b.device_count() > 0),
            Ok(Err(e)) => {
                assert_eq!(e.class(), ErrorClass::Unavailable, "{e}");
                assert!(e.to_string().contains("not available"), "{e}");
            }
            Err(_) => panic!("the cuda probe panicked"),
        }
    }
}
