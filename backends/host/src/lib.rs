//! # mscclpp-host — the CPU reference backend
//!
//! The embedded default of mscclpp-rs and the reference CI runs: it implements every HAL trait
//! with real behaviour, so that everything above the HAL runs with no accelerator.
//!
//! - **Memory** is shared memory (`memfd`) mapped into the process; a device address is the
//!   mapping's virtual address. An IPC handle lets another process of the same host map the same
//!   pages ([`memory`]).
//! - **Streams** are in-order executors, one worker thread each; events mark points in them
//!   ([`stream`]).
//! - **Kernels** are Rust functions registered under the same [`mscclpp_hal::KernelId`]s the GPU
//!   backends compile; their blocks run on worker threads and device-side atomics are Rust
//!   atomics on the shared mapping ([`kernels`]).
//! - **Multicast** is emulated: a mapped group exposes every member's memory ([`multicast`]).
//!
//! The file split (device, memory, stream, kernels, multicast) is the one every backend follows.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod device;
pub mod kernels;
pub mod memory;
pub mod multicast;
pub mod stream;

pub use device::{HostBackend, HostDevice};

use std::sync::Arc;

/// The host backend; it cannot be absent, but returns `Result` like every backend's probe.
pub fn probe() -> mscclpp_hal::Result<Arc<dyn mscclpp_hal::Backend>> {
    Ok(Arc::new(HostBackend::new()))
}
