//! The per-device context every runtime call runs in.
//!
//! **Context handling.** The HAL is called from many threads (the proxy, tests, stream users),
//! and the runtimes' "current context" / "current device" is per thread: every call that touches
//! the runtime first makes the owning context current on the calling thread ([`Context::bind`]:
//! `cuCtxSetCurrent` of a retained primary context on CUDA, `hipSetDevice` on ROCm; cheap).
//! Every object that owns runtime resources (allocations, streams, events, modules, graphs)
//! holds an `Arc<Context>`, so the context outlives them.

use std::sync::Arc;

use mscclpp_hal::Result;

use crate::runtime::Runtime;

/// The context of one device, retained while any resource of it lives.
#[derive(Debug)]
pub struct Context<R: Runtime> {
    rt: &'static R,
    ordinal: usize,
    raw: R::Context,
}

// SAFETY: the raw context is a runtime handle usable from any thread (each thread binds it
// before use); the value only stores it.
unsafe impl<R: Runtime> Send for Context<R> {}
// SAFETY: as above; `&Context` only hands the handle to runtime calls.
unsafe impl<R: Runtime> Sync for Context<R> {}

impl<R: Runtime> Context<R> {
    /// Retains the context of device `ordinal`.
    pub fn retain(rt: &'static R, ordinal: usize) -> Result<Arc<Self>> {
        let raw = rt.retain_context(ordinal)?;
        Ok(Arc::new(Context { rt, ordinal, raw }))
    }

    /// Makes this context current on the calling thread; called before every runtime call
    /// that needs one.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `raw` was retained in `retain` and is released only in Drop.
        unsafe { self.rt.bind(self.raw) }
    }

    /// Whether the device was reset under this context ([`Runtime::context_lost`]).
    pub fn lost(&self) -> bool {
        self.rt.context_lost(self.raw)
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The runtime.
    pub fn runtime(&self) -> &'static R {
        self.rt
    }

    /// The raw context.
    pub fn raw(&self) -> R::Context {
        self.raw
    }
}

impl<R: Runtime> Drop for Context<R> {
    fn drop(&mut self) {
        // SAFETY: balances the retain; every user of the context holds an `Arc<Context>`, so
        // none is left.
        if let Err(e) = unsafe { self.rt.release_context(self.ordinal, self.raw) } {
            tracing::warn!(device = self.ordinal, "{e}");
        }
    }
}
