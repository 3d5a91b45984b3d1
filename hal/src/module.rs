//! Kernel modules: the unit in which whoever owns a kernel hands it to the HAL.
//!
//! The HAL names no library kernel. A crate that owns kernels (an algorithm of the collectives,
//! the benchmark tool, a user) describes them in a `static` [`KernelModule`]: the device source
//! that every GPU vendor compiles (it includes the device API as `"mscclpp/<file>"`; only
//! `core.cuh` differs per vendor), the headers of its own it includes (its argument structs and
//! their generated layout checks), and for each entry point its name, the size of its one
//! argument struct and, optionally, the Rust function the host backend runs in its place. A
//! backend loads a kernel by module and name ([`crate::Device::load`]); a typed handle
//! ([`crate::TypedKernel`]) ties the name to its argument struct.

use std::fmt;

use crate::error::Result;
use crate::kernel::{KernelArgs, KernelId, LaunchConfig};

/// The signature of a host kernel: the launch shape and the bytes of its argument struct. Blocks
/// run concurrently on worker threads; device addresses in the arguments are addresses of this
/// process's mappings.
pub type HostKernelFn = fn(&LaunchConfig, &[u8]) -> Result<()>;

/// One entry point of a [`KernelModule`].
#[derive(Clone, Copy)]
pub struct KernelDef {
    /// Its name: the `extern "C"` symbol in the device source, or a C++ kernel's mangled name.
    pub id: KernelId,
    /// Bytes of its argument struct (checked at load against the typed handle, and at launch).
    pub param_size: usize,
    /// What the host backend runs in its place; `None`: the kernel exists on GPUs only.
    pub host: Option<HostKernelFn>,
}

impl KernelDef {
    /// An entry point taking an `A`, with a host implementation.
    pub const fn new<A: KernelArgs>(name: &'static str, host: HostKernelFn) -> Self {
        KernelDef {
            id: KernelId(name),
            param_size: std::mem::size_of::<A>(),
            host: Some(host),
        }
    }

    /// An entry point taking an `A` that only GPUs run.
    pub const fn device_only<A: KernelArgs>(name: &'static str) -> Self {
        KernelDef {
            id: KernelId(name),
            param_size: std::mem::size_of::<A>(),
            host: None,
        }
    }
}

impl fmt::Debug for KernelDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelDef")
            .field("id", &self.id)
            .field("param_size", &self.param_size)
            .field("host", &self.host.is_some())
            .finish()
    }
}

/// A compilation unit of device code and the kernels it defines.
#[derive(Debug)]
pub struct KernelModule {
    /// File name (what compile errors and the kernel cache name it by); the library's modules
    /// use their path under `kernels/`, e.g. `collectives/ll.cu`.
    pub name: &'static str,
    /// The device source, shared by CUDA and HIP; empty for a module of host kernels only.
    pub source: &'static str,
    /// Headers of the module's own, as `(include name, contents)`: what `#include "<name>"`
    /// resolves to in a run-time compile, besides the device API (part of the cache key).
    pub headers: &'static [(&'static str, &'static str)],
    /// Its entry points.
    pub kernels: &'static [KernelDef],
}

impl KernelModule {
    /// The entry point `id`, if the module defines it.
    pub fn kernel(&self, id: KernelId) -> Option<&KernelDef> {
        self.kernels.iter().find(|k| k.id == id)
    }

    /// The entry point `id`, or an error naming the module and what it does define.
    pub fn require(&self, id: KernelId) -> Result<&KernelDef> {
        self.kernel(id).ok_or_else(|| {
            let names: Vec<&str> = self.kernels.iter().map(|k| k.id.0).collect();
            crate::Error::invalid(format!(
                "module {} defines no kernel {id} (it defines {})",
                self.name,
                names.join(", ")
            ))
        })
    }
}
