//! # mscclpp-gpu — the GPU backend, written once
//!
//! CUDA and ROCm differ in their raw calls, not in what a stream, an allocation, an IPC import
//! or a module cache must do. This crate holds all of that logic once, generic over a vendor
//! [`Runtime`] (the wgpu-hal / UCX-UCT shape): `mscclpp-cuda` and `mscclpp-rocm` are each an FFI
//! table plus `impl Runtime`, and name their backend `GpuBackend<TheirRuntime>`.
//!
//! ## The `Runtime` contract
//! - It is a table of raw calls on raw handles (associated types: context, stream, event,
//!   module, function, graph), each returning [`mscclpp_hal::Result`] with errors already mapped
//!   to [`mscclpp_hal::Error::Driver`] under the vendor's name of the call and the code.
//! - Calls that take handles or addresses are `unsafe`: the generic code passes live handles
//!   and in-bounds addresses, and binds the owning [`Context`] on the calling thread first.
//! - What differs as data is data: [`Vendor`] (names, magics, the vendor's `core.cuh`, whether
//!   the GPUs have multicast) and [`Features`] (graph capture, borrowed streams, multicast entry
//!   points), probed when the runtime is opened. A behaviour one vendor lacks is a capability
//!   the generic code checks, never a second copy of the code.
//! - Nothing panics: a vendor's probe opens its libraries and checks its symbols before any
//!   call can reach them, and answers `Unavailable` with the reason.
//!
//! ## Layout
//! [`device`] (backend, devices) over [`context`] (the per-device context every other module
//! holds), [`memory`] (allocations), [`ipc`] (payloads, the same-process alias registry,
//! export/import; over [`memory`]), [`stream`] (streams, events, graphs) over
//! [`keep`] (keep-alive lists, deadline-polled waits, staged host copies), [`module`] (kernel
//! loading) over [`cache`] (the on-disk kernel cache), [`rtc`] (NVRTC/hipRTC driven through one
//! flow) and [`device_api`] (the embedded device API the owners' modules compile against),
//! [`multicast`] (guarded; not implemented in this build).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cache;
mod capture;
pub mod context;
pub mod device;
pub mod device_api;
pub mod ipc;
pub mod keep;
pub mod memory;
pub mod module;
pub mod multicast;
pub mod rtc;
pub mod runtime;
pub mod shareable;
pub mod stream;

pub use cache::{CacheStats, cache_stats};
pub use context::Context;
pub use device::{GpuBackend, GpuDevice};
pub use memory::GpuAllocation;
pub use module::{GpuKernel, LoadedModule};
pub use runtime::{Compiled, Features, IPC_HANDLE_SIZE, Image, IpcBytes, Runtime, Vendor};
pub use stream::{GpuEvent, GpuGraph, GpuStream};

/// The family of types ([`mscclpp_hal::Api`]) of the GPU backend over runtime `R`:
/// `Gpu<CudaRuntime>`, `Gpu<RocmRuntime>`.
pub struct Gpu<R>(std::marker::PhantomData<fn() -> R>);

impl<R> std::fmt::Debug for Gpu<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu<{}>", std::any::type_name::<R>())
    }
}

impl<R: Runtime> mscclpp_hal::Api for Gpu<R> {
    const NAME: &'static str = R::VENDOR.name;
    type Device = GpuDevice<R>;
    type Stream = GpuStream<R>;
    type Event = GpuEvent<R>;
    type Kernel = GpuKernel<R>;
    type Graph = GpuGraph<R>;
}
