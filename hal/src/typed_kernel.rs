//! [`TypedKernel`]: a loaded kernel tied to its argument struct, so that a launch cannot pass
//! the bytes of another struct; over a backend's [`Api`] (static down to the vendor call) or
//! over [`Dyn`], the backend chosen at run time.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::api::{Api, DeviceApi, Dyn, KernelApi, StreamApi};
use crate::error::{Error, Result};
use crate::kernel::{KernelArgs, KernelId, LaunchConfig};
use crate::module::KernelModule;

/// A kernel of a [`KernelModule`] loaded on one device of backend `A`, launched with a `T`.
pub struct TypedKernel<T, A: Api = Dyn> {
    kernel: Arc<A::Kernel>,
    args: PhantomData<fn(T)>,
}

impl<T, A: Api> Clone for TypedKernel<T, A> {
    fn clone(&self) -> Self {
        TypedKernel {
            kernel: self.kernel.clone(),
            args: PhantomData,
        }
    }
}

impl<T, A: Api> std::fmt::Debug for TypedKernel<T, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TypedKernel<{}, {}>({:?})",
            std::any::type_name::<T>(),
            A::NAME,
            self.kernel
        )
    }
}

impl<T: KernelArgs, A: Api> TypedKernel<T, A> {
    /// Loads kernel `id` of `module` on `device`, checking that the module declares it with an
    /// argument struct of `T`'s size.
    pub fn load(device: &A::Device, module: &'static KernelModule, id: KernelId) -> Result<Self> {
        let def = module.require(id)?;
        let size = std::mem::size_of::<T>();
        if def.param_size != size {
            return Err(Error::invalid(format!(
                "kernel {id} of module {} takes a {}-byte argument struct; {} is {size} bytes",
                module.name,
                def.param_size,
                std::any::type_name::<T>()
            )));
        }
        Ok(TypedKernel {
            kernel: DeviceApi::load(device, module, id)?,
            args: PhantomData,
        })
    }

    /// The loaded kernel.
    pub fn kernel(&self) -> &Arc<A::Kernel> {
        &self.kernel
    }

    /// Its name.
    pub fn id(&self) -> KernelId {
        KernelApi::id(&*self.kernel)
    }

    /// Enqueues the kernel on `stream`.
    ///
    /// # Safety
    /// As for [`crate::Stream::launch_raw`]: device addresses inside `args` must stay allocated
    /// until the kernel has run.
    pub unsafe fn launch(&self, stream: &A::Stream, cfg: LaunchConfig, args: &T) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { StreamApi::launch_raw(stream, &*self.kernel, cfg, args.as_bytes()) }
    }
}
