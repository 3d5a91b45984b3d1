//! # mscclpp-rocm — the AMD backend
//!
//! The HIP runtime as a [`mscclpp_gpu::Runtime`] table ([`runtime`]): everything a GPU backend
//! does is written once in `mscclpp-gpu`; this crate is the runtime's raw calls, the probe, and
//! hipRTC's names ([`hiprtc`]).
//!
//! The HIP runtime (`libamdhip64`) and hipRTC are opened at run time with `libloading`, never
//! linked, so a binary built with the `rocm` feature starts on machines without AMD software.
//! The declarations are our own ([`ffi`]): the `hip-sys` crate is not used because it links
//! `libamdhip64` at build time and needs the ROCm headers to build, which breaks the one-binary
//! rule (no vendor SDK at build time). Every required entry point is resolved when the runtime
//! is opened; a missing one, a missing library or the absence of a GPU is an `Unavailable` error
//! from [`probe`], never a panic. Stream capture and graphs are optional entry points: a
//! runtime without them opens, without graph capture. AMD GPUs have no multicast memory.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod ffi;
pub mod hiprtc;
pub mod probe;
pub mod runtime;

pub use probe::DriverInfo;
pub use runtime::RocmRuntime;

use std::sync::{Arc, OnceLock};

use mscclpp_hal::{Backend, Error, Result};

/// The AMD backend.
pub type RocmBackend = mscclpp_gpu::GpuBackend<RocmRuntime>;
/// The ROCm backend's family of types ([`mscclpp_hal::Api`]), for code generic over a backend.
pub type Rocm = mscclpp_gpu::Gpu<RocmRuntime>;
/// An opened AMD GPU.
pub type RocmDevice = mscclpp_gpu::GpuDevice<RocmRuntime>;
/// A stream of the AMD backend.
pub type RocmStream = mscclpp_gpu::GpuStream<RocmRuntime>;
/// An event of the AMD backend.
pub type RocmEvent = mscclpp_gpu::GpuEvent<RocmRuntime>;
/// An allocation of the AMD backend.
pub type RocmAllocation = mscclpp_gpu::GpuAllocation<RocmRuntime>;
/// A kernel of the AMD backend.
pub type RocmKernel = mscclpp_gpu::GpuKernel<RocmRuntime>;

/// How this process's HIP kernel modules were obtained so far.
pub fn cache_stats() -> mscclpp_gpu::CacheStats {
    mscclpp_gpu::cache_stats(mscclpp_hal::BackendKind::Rocm)
}

fn unavailable(reason: String) -> Error {
    Error::unavailable("rocm backend", reason)
}

/// Probes for a usable HIP runtime (every entry point present, `hipInit` succeeding) with at
/// least one device; opens the backend over it.
pub fn probe() -> Result<Arc<dyn Backend>> {
    Ok(probe_rocm()?)
}

/// The runtime table, made once the runtime passed the probe (a failed probe is not
/// remembered: the next one looks again).
fn runtime() -> Result<&'static RocmRuntime> {
    static RUNTIME: OnceLock<RocmRuntime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let api = ffi::api()?;
    let driver = probe::probe_with(api)?;
    if driver.devices <= 0 {
        return Err(unavailable(format!(
            "HIP runtime {} ({}) found but it reports no devices",
            probe::format_version(driver.runtime_version),
            api.library
        )));
    }
    Ok(RUNTIME.get_or_init(|| RocmRuntime { api, driver }))
}

/// [`probe`], returning the concrete type.
pub fn probe_rocm() -> Result<Arc<RocmBackend>> {
    let rt = runtime()?;
    let backend = RocmBackend::open(rt).map_err(|e| {
        unavailable(format!(
            "HIP runtime {} with {} device(s) found, but enumerating them failed: {e}",
            probe::format_version(rt.driver.runtime_version),
            rt.driver.devices
        ))
    })?;
    tracing::info!("{}", backend.describe());
    Ok(Arc::new(backend))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mscclpp_hal::ErrorClass;

    /// Without an AMD GPU (this repository's build machines have Debian's ROCm 5.2 runtime but
    /// no GPU) the probe answers `Unavailable` with the reason and never panics; where the
    /// runtime is installed the reason is hipInit's code (101 on ROCm 5.2, 100 on 5.7+). On an
    /// AMD GPU machine it succeeds.
    #[test]
    fn probe_never_panics_and_names_hipinit_without_a_gpu() {
        match std::panic::catch_unwind(probe) {
            Ok(Ok(b)) => assert!(b.device_count() > 0),
            Ok(Err(e)) => {
                assert_eq!(e.class(), ErrorClass::Unavailable, "{e}");
                let text = e.to_string();
                assert!(text.contains("rocm backend not available"), "{text}");
                let runtime_present = ffi::api().is_ok();
                let no_gpu = !std::path::Path::new("/dev/kfd").exists();
                if runtime_present && no_gpu {
                    assert!(text.contains("hipInit"), "{text}");
                    assert!(
                        text.contains("code 101") || text.contains("code 100"),
                        "{text}"
                    );
                }
            }
            Err(_) => panic!("the rocm probe panicked"),
        }
    }
}
