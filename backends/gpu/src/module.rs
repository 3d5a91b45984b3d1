//! Kernel loading: a module of [`crate::sources`] is compiled by the vendor's run-time compiler
//! for the device's target on first use, cached on disk ([`crate::cache`], under
//! `<MSCCLPP_CACHE_DIR>/<vendor>/`), loaded once per device; a kernel is a function of a loaded
//! module, which every kernel and every queued launch keeps alive.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;

use mscclpp_hal::kernel::known_param_size;
use mscclpp_hal::{Error, Kernel, KernelId, Result};

use crate::cache::{self, CompileKey};
use crate::device::Context;
use crate::runtime::Runtime;
use crate::sources::{self, Module};

/// A module loaded into one device's context; unloaded on drop.
#[derive(Debug)]
pub struct LoadedModule<R: Runtime> {
    ctx: Arc<Context<R>>,
    raw: R::Module,
    name: &'static str,
}

// SAFETY: a module is a runtime handle usable from any thread with its context current.
unsafe impl<R: Runtime> Send for LoadedModule<R> {}
// SAFETY: as above.
unsafe impl<R: Runtime> Sync for LoadedModule<R> {}

impl<R: Runtime> Drop for LoadedModule<R> {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: loaded by module_load, unloaded once; every kernel and every queued launch
            // of it holds this module, so none is left.
            if let Err(e) = unsafe { self.ctx.runtime().module_unload(self.raw) } {
                tracing::warn!(module = self.name, "{e}");
            }
        }
    }
}

/// A kernel of a loaded module.
#[derive(Debug)]
pub struct GpuKernel<R: Runtime> {
    id: KernelId,
    func: R::Function,
    module: Arc<LoadedModule<R>>,
    param_size: Option<usize>,
    max_threads_per_block: u32,
}

// SAFETY: a function is a runtime handle usable from any thread; its module is kept alive.
unsafe impl<R: Runtime> Send for GpuKernel<R> {}
// SAFETY: as above.
unsafe impl<R: Runtime> Sync for GpuKernel<R> {}

impl<R: Runtime> GpuKernel<R> {
    /// The raw function handle.
    pub fn raw(&self) -> R::Function {
        self.func
    }
    /// The module it belongs to.
    pub fn module(&self) -> &Arc<LoadedModule<R>> {
        &self.module
    }
    /// Ordinal of the device whose context loaded it.
    pub fn device_ordinal(&self) -> usize {
        self.module.ctx.ordinal()
    }
    /// Bytes of its (single) argument struct, where the runtime or the kernel table knows.
    pub fn param_size(&self) -> Option<usize> {
        self.param_size
    }
    /// Most threads per block this kernel can be launched with.
    pub fn max_threads_per_block(&self) -> u32 {
        self.max_threads_per_block
    }
}

impl<R: Runtime> Kernel for GpuKernel<R> {
    fn id(&self) -> KernelId {
        self.id
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn max_threads_per_block(&self) -> Option<u32> {
        Some(GpuKernel::max_threads_per_block(self))
    }
}

/// The image of `module` for a device of architecture `arch`: cached, or compiled now.
fn image<R: Runtime>(rt: &R, arch: &str, module: &Module) -> Result<crate::Image> {
    let target = R::rtc_target(arch);
    // Without the compiler nothing can be compiled (and the cache key needs its version).
    let version = rt.rtc_version()?;
    let headers = sources::headers(R::VENDOR.core_header);
    let options = rt.rtc_options();
    let dir = mscclpp_hal::env::cache_dir().join(R::VENDOR.cache_dir);
    let key = CompileKey {
        module,
        headers: &headers,
        target,
        version,
        options: &options,
    };
    cache::image_for(&R::VENDOR, &dir, key, || {
        rt.compile(module.name, module.source, &headers, target)
    })
}

fn load_module<R: Runtime>(
    ctx: &Arc<Context<R>>,
    arch: &str,
    module: &'static Module,
) -> Result<Arc<LoadedModule<R>>> {
    let rt = ctx.runtime();
    let image = image(rt, arch, module)?;
    ctx.bind()?;
    // SAFETY: `image` is a complete image of this vendor (compiler output or a checksummed
    // cache entry of one); the context is current.
    let raw = unsafe { rt.module_load(&image.bytes) }.map_err(|e| {
        e.with_context(|| {
            format!(
                "module {}, image kind {} for {} on a {arch} device",
                module.name,
                image.kind,
                R::rtc_target(arch)
            )
        })
    })?;
    Ok(Arc::new(LoadedModule {
        ctx: ctx.clone(),
        raw,
        name: module.name,
    }))
}

/// Loads kernel `id` on the device of `ctx`, loading (and if needed compiling) its module once.
pub fn load_kernel<R: Runtime>(
    ctx: &Arc<Context<R>>,
    arch: &str,
    loaded: &mut HashMap<&'static str, Arc<LoadedModule<R>>>,
    id: KernelId,
) -> Result<GpuKernel<R>> {
    let module = sources::module_for(id).ok_or_else(|| {
        Error::invalid(format!(
            "no {} kernel named {id}: none of the embedded modules ({}) defines it",
            R::VENDOR.runtime,
            sources::MODULES
                .iter()
                .map(|m| m.name)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let m = match loaded.get(module.name) {
        Some(m) => m.clone(),
        None => {
            let m = load_module(ctx, arch, module)?;
            loaded.insert(module.name, m.clone());
            m
        }
    };
    ctx.bind()?;
    let rt = ctx.runtime();
    let name = CString::new(id.name())
        .map_err(|_| Error::invalid(format!("kernel name {id:?} contains a NUL byte")))?;
    // SAFETY: live module of the current context; NUL-terminated name.
    let func = unsafe { rt.module_function(m.raw, &name) }
        .map_err(|e| Error::invalid(format!("kernel {id} not found in module {}: {e}", m.name)))?;
    // SAFETY: live function of the current context.
    let max_threads = unsafe { rt.function_max_threads(func) }?;
    // SAFETY: as above.
    let param_size = unsafe { rt.function_param_size(func) }.or_else(|| known_param_size(id));
    Ok(GpuKernel {
        id,
        func,
        module: m,
        param_size,
        // Where the runtime does not say, the device limit applies.
        max_threads_per_block: max_threads.filter(|&n| n > 0).unwrap_or(u32::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_sizes_match_the_hal_structs() {
        assert_eq!(known_param_size(KernelId::FILL_U32), Some(24));
        assert_eq!(known_param_size(KernelId::ATOMIC_ADD_U64), Some(16));
        assert_eq!(known_param_size(KernelId("no_such_kernel")), None);
    }
}
