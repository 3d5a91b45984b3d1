//! # mscclpp-rocm — the AMD backend
//!
//! The HIP runtime (`libamdhip64`) and hipRTC are opened at run time with `libloading`, never
//! linked, so a binary built with the `rocm` feature starts on machines without AMD software.
//! The declarations are our own ([`ffi`]): the `hip-sys` crate is not used because it links
//! `libamdhip64` at build time and needs the ROCm headers to build, which breaks the one-binary
//! rule (no vendor SDK at build time). Every entry point is resolved when the runtime is opened;
//! a missing one, a missing library or the absence of a GPU is an `Unavailable` error from
//! [`probe`], never a panic.
//!
//! The structure mirrors the CUDA backend: [`device`] (backend, devices, the per-thread current
//! device), [`memory`] (allocations of each kind, IPC with a same-process alias registry),
//! [`stream`] (streams with kept-alive buffers and deadline-polled waits, events), [`module`]
//! (hipRTC compilation for the device's gfx processor, the on-disk cache, loading, launching
//! with one argument struct; sources in [`kernels`], compiler in [`hiprtc`]), [`multicast`]
//! (always unsupported: AMD GPUs have none).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod device;
pub mod ffi;
pub mod hiprtc;
pub mod kernels;
pub mod memory;
pub mod module;
pub mod multicast;
pub mod runtime;
pub mod stream;

pub use device::{DeviceCtx, RocmBackend, RocmDevice};
pub use memory::RocmAllocation;
pub use module::{CacheStats, RocmKernel, cache_stats};
pub use stream::{RocmEvent, RocmStream};

use std::sync::Arc;

use mscclpp_hal::{Backend, Error, Result};

fn unavailable(reason: String) -> Error {
    Error::unavailable("rocm backend", reason)
}

/// Probes for a usable HIP runtime (every entry point present, `hipInit` succeeding) with at
/// least one device; opens the backend over it.
pub fn probe() -> Result<Arc<dyn Backend>> {
    Ok(probe_rocm()?)
}

/// [`probe`], returning the concrete type.
pub fn probe_rocm() -> Result<Arc<RocmBackend>> {
    let api = ffi::api()?;
    let info = runtime::probe_with(api)?;
    let version = runtime::format_version(info.runtime_version);
    if info.devices <= 0 {
        return Err(unavailable(format!(
            "HIP runtime {version} ({}) found but it reports no devices",
            api.library
        )));
    }
    let backend = RocmBackend::open(api, info).map_err(|e| {
        unavailable(format!(
            "HIP runtime {version} with {} device(s) found, but enumerating them failed: {e}",
            info.devices
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
