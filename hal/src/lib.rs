//! # mscclpp-hal — the vendor-neutral hardware abstraction of mscclpp-rs
//!
//! Everything above this crate (transports, the communication layer, collectives) talks to
//! accelerators only through the traits defined here, so that one binary serves NVIDIA (CUDA),
//! AMD (ROCm) and CPU-only hosts. This crate depends on no vendor library.
//!
//! ## The contract a backend fulfils
//! - [`Backend`]: probed at run time; absence is an [`Error::Unavailable`] with the reason, never
//!   a panic. Enumerates devices with [`DeviceInfo`] (properties and [`Capabilities`] as data)
//!   and a [`PeerMatrix`].
//! - [`Device`]: allocates [`DeviceBuffer`]s of each [`MemoryKind`]; creates [`Stream`]s and
//!   [`Event`]s; exports and imports [`IpcHandle`]s so that another process on the same host
//!   maps the same memory; creates and imports [`MulticastGroup`]s where
//!   [`MulticastSupport`] allows; loads kernels of a [`KernelModule`] by [`KernelId`] — the
//!   module's owner (an algorithm, a tool, a user) gives its device source and host functions;
//!   the HAL names no kernel of the library.
//! - [`Stream`]: in-order; copies, fills and launches are asynchronous; errors are sticky and
//!   surface at [`Stream::synchronize_timeout`]. Buffers used by enqueued work stay alive until
//!   the work has run, whatever the caller drops.
//! - Kernels take exactly one `#[repr(C)]` struct implementing [`KernelArgs`], defined by the
//!   kernel's owner and mirrored in its device source ([`dev::layout`] generates the
//!   `static_assert`s that check the mirror in every compile).
//! - Every byte that crosses a process goes through [`wire`]: versioned, bounded, validated.
//!
//! Each backend implements the typed traits of [`api`] ([`Api`] names its device, stream, event,
//! kernel and graph types, whose methods take each other directly); the object-safe traits above
//! are provided for them by one adapter each ([`api::erase`]), the only place where a trait
//! object handed to another is turned back into its backend's type.
//!
//! Errors are typed ([`Error`]) and classified ([`ErrorClass`]). Configuration comes from the
//! environment through [`env`](mod@env).
#![deny(unsafe_op_in_unsafe_fn)]

// The vocabulary below the HAL (its own crate, `mscclpp-base`), where HAL users find it.
pub use mscclpp_base::{dtype, env, error, exit, net, plugin_log, wire};

pub mod api;
pub mod caps;
pub mod dev;
pub mod device;
pub mod ipc;
pub mod kernel;
pub mod mapped;
pub mod memory;
pub mod module;
pub mod multicast;
pub mod stream;
pub mod symmetric;
pub mod typed_kernel;

pub use api::{Api, DeviceApi, EventApi, GraphApi, KernelApi, StreamApi};
pub use caps::{BackendKind, Capabilities, DeviceInfo, MulticastSupport, PeerMatrix};
pub use device::{Backend, Device};
pub use dtype::{DataType, ReduceOp};
pub use error::{Error, ErrorClass, Result};
pub use ipc::{IpcHandle, IpcHandleKind};
pub use kernel::{Kernel, KernelArgs, KernelId, LaunchConfig};
pub use memory::{
    Allocation, BufferSlice, DeviceBuffer, DevicePtr, ExternalAllocation, MemoryKind,
};
pub use module::{HostKernelFn, KernelDef, KernelModule};
pub use multicast::{MulticastAddress, MulticastGroup, MulticastMapping};
pub use stream::{DynStream, Event, Graph, Stream, WaitCmp};
pub use symmetric::{AddressSpace, Shareable};
pub use typed_kernel::{DynKernel, TypedKernel};
