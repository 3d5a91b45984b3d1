//! [`TypedKernel`]: a loaded kernel tied to its argument struct, so that a launch cannot pass
//! the bytes of another struct.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::kernel::{Kernel, KernelArgs, KernelId, LaunchConfig};
use crate::module::KernelModule;
use crate::stream::Stream;

/// A kernel of a [`KernelModule`] loaded on one device, launched with an `A`.
pub struct TypedKernel<A> {
    kernel: Arc<dyn Kernel>,
    args: PhantomData<fn(A)>,
}

impl<A> Clone for TypedKernel<A> {
    fn clone(&self) -> Self {
        TypedKernel {
            kernel: self.kernel.clone(),
            args: PhantomData,
        }
    }
}

impl<A> std::fmt::Debug for TypedKernel<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TypedKernel<{}>({:?})",
            std::any::type_name::<A>(),
            self.kernel
        )
    }
}

impl<A: KernelArgs> TypedKernel<A> {
    /// Loads kernel `id` of `module` on `device`, checking that the module declares it with an
    /// argument struct of `A`'s size.
    pub fn load(device: &dyn Device, module: &'static KernelModule, id: KernelId) -> Result<Self> {
        let def = module.require(id)?;
        let size = std::mem::size_of::<A>();
        if def.param_size != size {
            return Err(Error::invalid(format!(
                "kernel {id} of module {} takes a {}-byte argument struct; {} is {size} bytes",
                module.name,
                def.param_size,
                std::any::type_name::<A>()
            )));
        }
        Ok(TypedKernel {
            kernel: device.load(module, id)?,
            args: PhantomData,
        })
    }

    /// The loaded kernel.
    pub fn kernel(&self) -> &Arc<dyn Kernel> {
        &self.kernel
    }

    /// Its name.
    pub fn id(&self) -> KernelId {
        self.kernel.id()
    }

    /// Enqueues the kernel on `stream`.
    ///
    /// # Safety
    /// As for [`Stream::launch_raw`]: device addresses inside `args` must stay allocated until
    /// the kernel has run.
    pub unsafe fn launch(&self, stream: &dyn Stream, cfg: LaunchConfig, args: &A) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { stream.launch_raw(&*self.kernel, cfg, args.as_bytes()) }
    }
}
