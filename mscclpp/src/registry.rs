//! Run-time selection of a backend among those compiled in.
//!
//! Backends are probed in priority order (CUDA, ROCm, host); a failed probe is logged and
//! skipped, and the host backend always answers. `MSCCLPP_BACKEND=host|cuda|rocm` forces one:
//! then its failure is the error, with the reason, rather than a silent fallback.

use std::sync::Arc;

use mscclpp_hal::{Backend, BackendKind, Error, Result};

/// What probing one backend found.
#[derive(Debug)]
pub struct ProbeOutcome {
    /// Which backend.
    pub kind: BackendKind,
    /// The backend, or why it is not available (also when it was not compiled in).
    pub result: Result<Arc<dyn Backend>>,
}

/// Whether a backend was compiled into this binary.
pub fn is_compiled(kind: BackendKind) -> bool {
    match kind {
        BackendKind::Host => true,
        BackendKind::Cuda => cfg!(feature = "cuda"),
        BackendKind::Rocm => cfg!(feature = "rocm"),
    }
}

/// Probes one backend.
pub fn probe(kind: BackendKind) -> Result<Arc<dyn Backend>> {
    match kind {
        BackendKind::Host => mscclpp_host::probe(),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => mscclpp_cuda::probe(),
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => mscclpp_rocm::probe(),
        #[allow(unreachable_patterns)]
        other => Err(Error::unavailable(
            format!("{other} backend"),
            format!("this binary was built without the `{other}` feature"),
        )),
    }
}

/// Probes every backend, in priority order.
pub fn probe_all() -> Vec<ProbeOutcome> {
    BackendKind::ALL
        .into_iter()
        .map(|kind| ProbeOutcome {
            kind,
            result: probe(kind),
        })
        .collect()
}

/// Why each GPU backend is not in use, one line per backend (`cuda backend not available: the
/// CUDA driver library could not be opened (tried …)`): what a tool prints when it runs on the
/// host backend, so that a user who expected a GPU learns what was missing instead of guessing.
pub fn why_no_gpu() -> Vec<String> {
    BackendKind::ALL
        .into_iter()
        .filter(|&kind| kind != BackendKind::Host)
        .filter_map(|kind| probe(kind).err().map(|e| e.to_string()))
        .collect()
}

/// Whether this is the first selection of the process (it is logged at info level once; the C
/// library selects at every call that needs the backend).
fn first_selection() -> bool {
    static SELECTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    !SELECTED.swap(true, std::sync::atomic::Ordering::Relaxed)
}

/// Selects a backend: the one `MSCCLPP_BACKEND` names, else the first that probes successfully.
pub fn select() -> Result<Arc<dyn Backend>> {
    let first = first_selection();
    if let Some(kind) =
        mscclpp_hal::env::parse::<BackendKind>("MSCCLPP_BACKEND", "host, cuda or rocm")?
    {
        let b = probe(kind)?;
        if first {
            tracing::info!(backend = %kind, "backend forced by MSCCLPP_BACKEND: {}", b.describe());
        }
        return Ok(b);
    }
    for outcome in probe_all() {
        match outcome.result {
            Ok(b) => {
                if first {
                    tracing::info!(backend = %outcome.kind, "selected: {}", b.describe());
                }
                return Ok(b);
            }
            Err(e) if first => tracing::info!(backend = %outcome.kind, "skipped: {e}"),
            Err(e) => tracing::debug!(backend = %outcome.kind, "skipped: {e}"),
        }
    }
    Err(Error::Internal("no backend answered, not even host".into()))
}
