//! Kernels of the host backend: the Rust functions that the owners of kernel modules give for
//! their entry points ([`mscclpp_hal::KernelDef::host`]). The backend holds no kernel of its own:
//! a module's owner (the collectives, the benchmark kernels, a user) defines the host function
//! beside its device source, and [`crate::HostDevice`] runs it.
//!
//! A host kernel receives the launch shape and the bytes of its `#[repr(C)]` argument struct.
//! Blocks run concurrently on worker threads ([`mscclpp_hal::dev::for_each_block`]); device
//! addresses in the arguments are addresses of this process's mappings.

use mscclpp_hal::KernelId;

pub use mscclpp_hal::HostKernelFn;

/// Most threads in one host "block" (the launch limit the streams check and the devices
/// report).
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;

/// A kernel loaded on the host backend: the host function of a module's entry point.
#[derive(Debug, Clone, Copy)]
pub struct HostKernel {
    pub(crate) id: KernelId,
    pub(crate) func: HostKernelFn,
}

impl mscclpp_hal::KernelApi for HostKernel {
    type A = crate::Host;

    fn id(&self) -> KernelId {
        self.id
    }
}
