//! Kernel loading: a [`KernelModule`] handed over by its owner is compiled (its source, with the
//! device API of [`crate::device_api`] and the module's own headers) by the vendor's run-time
//! compiler for the device's target on first use, cached on disk ([`crate::cache`], under
//! `<MSCCLPP_CACHE_DIR>/<vendor>/`), loaded once per device and module (name and source hash);
//! a kernel is a function of a loaded module, which every kernel and every queued launch keeps
//! alive. Launches are checked against the argument size the module declares.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;

use mscclpp_hal::{Error, KernelApi, KernelId, KernelModule, Result};

use crate::cache::{self, CompileKey, Fnv128};
use crate::context::Context;
use crate::device_api;
use crate::runtime::Runtime;

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
    param_size: usize,
    max_threads_per_block: u32,
}

// SAFETY: a function is a runtime handle usable from any thread; its module is kept alive.
unsafe impl<R: Runtime> Send for GpuKernel<R> {}
// SAFETY: as above.
unsafe impl<R: Runtime> Sync for GpuKernel<R> {}

impl<R: Runtime> GpuKernel<R> {
    /// Which kernel this is.
    pub fn id(&self) -> KernelId {
        self.id
    }
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
    /// Bytes of its (single) argument struct, as its module declares.
    pub fn param_size(&self) -> usize {
        self.param_size
    }
    /// Most threads per block this kernel can be launched with.
    pub fn max_threads_per_block(&self) -> u32 {
        self.max_threads_per_block
    }
}

impl<R: Runtime> KernelApi for GpuKernel<R> {
    type A = crate::Gpu<R>;

    fn id(&self) -> KernelId {
        self.id
    }
    fn max_threads_per_block(&self) -> Option<u32> {
        Some(GpuKernel::max_threads_per_block(self))
    }
}

/// Which loaded module serves a [`KernelModule`] on one device: its name and the hash of its
/// source and own headers (two modules of one name but different text never share a load).
pub type ModuleKey = (&'static str, u128);

/// The [`ModuleKey`] of `module`.
pub fn module_key(module: &KernelModule) -> ModuleKey {
    let mut h = Fnv128::default();
    h.field(module.source.as_bytes());
    for (name, contents) in module.headers {
        h.field(name.as_bytes()).field(contents.as_bytes());
    }
    (module.name, h.finish())
}

/// The image of `module` for a device of architecture `arch`: cached, or compiled now.
fn image<R: Runtime>(rt: &R, arch: &str, module: &KernelModule) -> Result<crate::Image> {
    let target = R::rtc_target(arch);
    // Without the compiler nothing can be compiled (and the cache key needs its version).
    let version = rt.rtc_version()?;
    let headers = device_api::module_headers(R::VENDOR.core_header, module);
    let options = rt.rtc_options();
    let dir = mscclpp_hal::env::cache_dir().join(R::VENDOR.cache_dir);
    let key = CompileKey {
        name: module.name,
        source: module.source,
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
    module: &'static KernelModule,
) -> Result<Arc<LoadedModule<R>>> {
    if module.source.is_empty() {
        return Err(Error::unavailable(
            format!("module {}", module.name),
            format!(
                "it has no device source (host kernels only), so {} cannot run it",
                R::VENDOR.runtime
            ),
        ));
    }
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

/// Loads kernel `id` of `module` on the device of `ctx`, loading (and if needed compiling) the
/// module once per device (`loaded`).
pub fn load_kernel<R: Runtime>(
    ctx: &Arc<Context<R>>,
    arch: &str,
    loaded: &mut HashMap<ModuleKey, Arc<LoadedModule<R>>>,
    module: &'static KernelModule,
    id: KernelId,
) -> Result<GpuKernel<R>> {
    let def = module.require(id)?;
    let key = module_key(module);
    let m = match loaded.get(&key) {
        Some(m) => m.clone(),
        None => {
            let m = load_module(ctx, arch, module)?;
            loaded.insert(key, m.clone());
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
    // Where the runtime knows the compiled kernel's parameter size, it must be the declared one:
    // a mismatch means the device source and the Rust struct disagree.
    // SAFETY: as above.
    if let Some(compiled) = unsafe { rt.function_param_size(func) } {
        if compiled != def.param_size {
            return Err(Error::invalid(format!(
                "kernel {id} of module {}: the compiled kernel takes {compiled} bytes of \
                 arguments, the module declares {}",
                module.name, def.param_size
            )));
        }
    }
    Ok(GpuKernel {
        id,
        func,
        module: m,
        param_size: def.param_size,
        // Where the runtime does not say, the device limit applies.
        max_threads_per_block: max_threads.filter(|&n| n > 0).unwrap_or(u32::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_keys_follow_the_name_source_and_headers() {
        static A: KernelModule = KernelModule {
            name: "a.cu",
            source: "x",
            headers: &[],
            kernels: &[],
        };
        static B: KernelModule = KernelModule {
            name: "a.cu",
            source: "y",
            headers: &[],
            kernels: &[],
        };
        static C: KernelModule = KernelModule {
            name: "a.cu",
            source: "x",
            headers: &[("h", "")],
            kernels: &[],
        };
        assert_eq!(module_key(&A), module_key(&A));
        assert_ne!(module_key(&A), module_key(&B));
        assert_ne!(module_key(&A), module_key(&C));
        assert_eq!(module_key(&A).0, "a.cu");
    }
}
