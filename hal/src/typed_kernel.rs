//! A loaded kernel tied to its argument struct, so that a launch cannot pass the bytes of
//! another struct: [`TypedKernel`] over a backend's [`Api`], static down to the vendor call, and
//! [`DynKernel`] over the trait objects, for code that launches on the run-time stream.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::api::{Api, DeviceApi, KernelApi, StreamApi};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::kernel::Kernel;
use crate::kernel::{KernelArgs, KernelId, LaunchConfig};
use crate::module::KernelModule;
use crate::stream::Stream;

/// A kernel of a [`KernelModule`] loaded on one device of backend `A`, launched with a `T`.
pub struct TypedKernel<T, A: Api> {
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
        check_args::<T>(module, id)?;
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

/// Checks that `module` declares kernel `id` with an argument struct of `T`'s size.
fn check_args<T>(module: &'static KernelModule, id: KernelId) -> Result<()> {
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
    Ok(())
}

/// A kernel loaded through the trait objects, launched with a `T` on the run-time stream
/// (`dyn Stream`): for code that holds the device a registry opened (the executor, the
/// benchmark's own kernels). A stream of another backend is refused by the backend's adapter.
pub struct DynKernel<T> {
    kernel: Arc<dyn Kernel>,
    args: PhantomData<fn(T)>,
}

impl<T> Clone for DynKernel<T> {
    fn clone(&self) -> Self {
        DynKernel {
            kernel: self.kernel.clone(),
            args: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for DynKernel<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DynKernel<{}>({:?})",
            std::any::type_name::<T>(),
            self.kernel
        )
    }
}

impl<T: KernelArgs> DynKernel<T> {
    /// Loads kernel `id` of `module` on `device`, checking its argument struct's size.
    pub fn load(device: &dyn Device, module: &'static KernelModule, id: KernelId) -> Result<Self> {
        check_args::<T>(module, id)?;
        Ok(DynKernel {
            kernel: device.load(module, id)?,
            args: PhantomData,
        })
    }

    /// The loaded kernel.
    pub fn kernel(&self) -> &Arc<dyn Kernel> {
        &self.kernel
    }

    /// Enqueues the kernel on `stream`.
    ///
    /// # Safety
    /// As for [`crate::Stream::launch_raw`]: device addresses inside `args` must stay allocated
    /// until the kernel has run.
    pub unsafe fn launch(&self, stream: &dyn Stream, cfg: LaunchConfig, args: &T) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { stream.launch_raw(&*self.kernel, cfg, args.as_bytes()) }
    }
}
