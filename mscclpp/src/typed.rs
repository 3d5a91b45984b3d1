//! The one erasure point between code written over a backend's own types (`A: hal::Api`) and
//! the callers that pick the backend at run time (the C library, Python, the benchmark): code
//! over `A` is compiled once per backend built in, and [`by_backend`] picks the one a
//! communicator's device belongs to.

use std::sync::Arc;

use mscclpp_collectives::moe::{AnyMoe, Moe, MoeConfig};
use mscclpp_collectives::{AnyCollectives, Collectives};
use mscclpp_comm::Communicator;
use mscclpp_hal::{Api, BackendKind, Error, Result};

/// What is made over a backend's own types ([`by_backend`]): the collectives, an expert-parallel
/// exchange, a benchmark.
pub trait PerBackend {
    /// What is made.
    type Out;
    /// Makes it over `A`'s types (the communicator's device is an `A` device).
    fn on<A: Api>(self, comm: Arc<Communicator>) -> Result<Self::Out>;
}

/// Makes `what` over the communicator's backend's own types (host, CUDA, ROCm, as built in), so
/// that a call checks its stream's type once and runs with no downcast down to the vendor's
/// launch. A device that is not its backend's own type (a wrapper around one) is refused here,
/// naming the backend, as is a backend this build leaves out.
pub fn by_backend<P: PerBackend>(comm: Arc<Communicator>, what: P) -> Result<P::Out> {
    fn typed<A: Api, P: PerBackend>(comm: Arc<Communicator>, what: P) -> Result<P::Out> {
        A::device_of(comm.device()).map_err(|e| {
            Error::invalid(format!(
                "the communicator's device reports the {} backend but is not that backend's own \
                 device type (a wrapper around one?): collectives run on a backend's own types ({e})",
                A::NAME
            ))
        })?;
        what.on::<A>(comm)
    }
    // The way out over the trait objects went with them (2026-12-07): say so to whoever still
    // sets it, once per process, rather than ignore it silently.
    static SAID: std::sync::Once = std::sync::Once::new();
    if std::env::var("MSCCLPP_TYPED").is_ok_and(|v| v.trim() == "0") {
        SAID.call_once(|| {
            tracing::warn!(
                "MSCCLPP_TYPED=0 is no longer served: the collectives always run over the \
                 backend's own types"
            )
        });
    }
    match comm.device().info().backend {
        BackendKind::Host => typed::<mscclpp_host::Host, P>(comm, what),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => typed::<mscclpp_cuda::Cuda, P>(comm, what),
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => typed::<mscclpp_rocm::Rocm, P>(comm, what),
        #[allow(unreachable_patterns)]
        other => Err(Error::unavailable(
            format!("the {other:?} backend's collectives"),
            "that backend is not built into this library (its cargo feature is off)",
        )),
    }
}

/// The collectives of `comm` with LL slots of `slot_bytes`, over its backend's own types, as one
/// trait object (a collective call: every rank makes it).
pub fn collectives(comm: Arc<Communicator>, slot_bytes: u64) -> Result<Box<dyn AnyCollectives>> {
    struct Make(u64);
    impl PerBackend for Make {
        type Out = Box<dyn AnyCollectives>;
        fn on<A: Api>(self, comm: Arc<Communicator>) -> Result<Self::Out> {
            Ok(Box::new(Collectives::<A>::with_slot_bytes(comm, self.0)?))
        }
    }
    by_backend(comm, Make(slot_bytes))
}

/// An expert-parallel exchange of `comm` for `cfg` ([`Moe`]) over its backend's own types, as
/// one trait object (a collective call).
pub fn expert_exchange(comm: &Arc<Communicator>, cfg: MoeConfig) -> Result<Box<dyn AnyMoe>> {
    struct Make(MoeConfig);
    impl PerBackend for Make {
        type Out = Box<dyn AnyMoe>;
        fn on<A: Api>(self, comm: Arc<Communicator>) -> Result<Self::Out> {
            Ok(Box::new(Moe::<A>::new(&comm, self.0)?))
        }
    }
    by_backend(comm.clone(), Make(cfg))
}
