//! What the channel and kernel factories take from a communicator: its communicator and
//! internal stream, channels' local memory, and its device for the run-time compiler.

use pyo3::prelude::*;

use super::Communicator;
use crate::channels;
use crate::errors::usage;

impl Communicator {
    pub(super) fn parts(&self) -> PyResult<channels::Parts> {
        let inner = self.inner()?;
        Ok(channels::Parts {
            comm: inner.comm().clone(),
            stream: inner.caller.internal().clone(),
        })
    }

    /// Local memory of a channel: a `Buffer` of this communicator's device, or on a GPU a
    /// caller's array (wrapped, not copied; a peer may map it).
    pub(super) fn channel_memory(
        &self,
        obj: &Bound<'_, PyAny>,
        what: &str,
    ) -> PyResult<channels::Memory> {
        let inner = self.inner()?;
        if let Ok(b) = obj.cast::<channels::Buffer>() {
            let buf = &b.get().buf;
            let dev = inner.device().info();
            let ordinal = buf.allocation().device_ordinal();
            if buf.backend() != dev.backend || ordinal != dev.ordinal {
                return Err(usage(format!(
                    "{what}: a Buffer of {}:{ordinal}, but this communicator runs on {}:{}",
                    buf.backend(),
                    dev.backend,
                    dev.ordinal
                )));
            }
            return Ok((buf.full(), obj.clone().unbind()));
        }
        if inner.host() {
            return Err(usage(format!(
                "{what}: on the host backend channel memory must come from \
                 Communicator.alloc() (shared memory the peer can map), not {}",
                obj.get_type().name()?
            )));
        }
        // Memory a peer maps may be a caller's array too: CudaIpc exports the allocation that
        // holds it (torch's caching allocator's segment) with the array's offset in it.
        let v = inner.view(obj, what, None)?;
        if v.nbytes() == 0 {
            return Err(usage(format!("{what}: an empty array")));
        }
        Ok((inner.wrap(&v)?.full(), obj.clone().unbind()))
    }

    pub(crate) fn compile_kernel_on(
        &self,
        py: Python<'_>,
        source: &str,
        name: &str,
        arg_size: Option<usize>,
    ) -> PyResult<channels::Kernel> {
        let dev = self.inner()?.device().clone();
        channels::compile(py, dev, source, name, arg_size)
    }
}
