//! # mscclpp — GPU-driven communication for AI clusters, one binary for every vendor
//!
//! The facade of mscclpp-rs. It re-exports the layers underneath and picks a backend at run
//! time:
//!
//! - [`hal`]: the vendor-neutral hardware abstraction (devices, memory, streams, IPC, multicast,
//!   kernels);
//! - backends: [`host`] (always built; the CPU reference), CUDA and ROCm (features `cuda` and
//!   `rocm`, on by default, opened at run time — no vendor SDK is needed to build);
//! - [`comm`]: the bootstrap (TCP rendezvous), the communicator, semaphores, memory, port and
//!   switch channels, and the host proxy;
//! - [`transports`] and [`collectives`];
//! - [`typed::by_backend`]: code written over a backend's own types (`A: hal::Api`), made
//!   for the backend a communicator's device belongs to (the one erasure point);
//! - `init_logging` (feature `logging`, off by default): a `tracing` subscriber for binaries.
//!
//! The benchmark kernels, the process launcher and the channel examples live in the benchmark
//! crate, `mscclpp-perf`.
//!
//! ```no_run
//! let backend = mscclpp::registry::select()?;          // CUDA, else ROCm, else host
//! let device = backend.open_device(0)?;
//! let buf = device.alloc(1 << 20, mscclpp::hal::MemoryKind::Device)?;
//! let stream = device.create_stream()?;
//! stream.fill(&buf.full(), 0)?;
//! stream.synchronize()?;
//! # Ok::<(), mscclpp::hal::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(feature = "logging")]
pub mod logging;
pub mod registry;
pub mod typed;

pub use mscclpp_base as base;
pub use mscclpp_bootstrap as bootstrap;
pub use mscclpp_collectives as collectives;
pub use mscclpp_comm as comm;
pub use mscclpp_executor as executor;
pub use mscclpp_hal as hal;
pub use mscclpp_host as host;
pub use mscclpp_transports as transports;

#[cfg(feature = "cuda")]
pub use mscclpp_cuda as cuda;
#[cfg(feature = "rocm")]
pub use mscclpp_rocm as rocm;

#[cfg(feature = "logging")]
pub use logging::init_logging;
pub use mscclpp_hal::{Error, ErrorClass, Result};

/// The README's examples, compiled as doctests so they cannot rot.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
