//! Registered buffers: arrays every rank's collectives map once, so that all-reduces read them
//! in place on the peers.
//!
//! Memory that cannot be exported to the peers (the legacy IPC handle exists only for the plain
//! allocator's memory: PyTorch's expandable segments, made with the virtual-memory calls and
//! possibly of several mappings, have none) is registered as NCCL's `ncclCommRegister` of such
//! memory is served here (nccl/src/register.rs): recorded, and calls on it copy as without it.
//! Every rank first says whether its buffer can be exported, so that all of them take the same
//! path: a rank failing inside the collective mapping would leave the others waiting for its
//! handle.

use std::sync::Mutex;

use mscclpp::collectives::Window;
use mscclpp::hal::{BufferSlice, DeviceBuffer};
use mscclpp::transports::{Transport, TransportFlags};
use pyo3::prelude::*;

use super::{Communicator, lock};
use crate::errors::{IntoPy, usage};

/// A buffer registered with every rank's collectives ([`Communicator::register`]).
#[pyclass(module = "mscclpp_rs", frozen)]
#[derive(Debug)]
pub struct RegisteredBuffer {
    /// `Some` while registered; inside, the peers' mapping where every rank's buffer could be
    /// exported (zero copy), `None` where the registration is only recorded.
    window: Mutex<Option<Option<Window>>>,
    /// Its device range, as `Inner::registered` holds it.
    range: (u64, u64),
    /// The wrapper of the caller's memory and the caller's object: both live as long as the
    /// registration.
    _buffer: DeviceBuffer,
    array: Py<PyAny>,
}

#[pymethods]
impl RegisteredBuffer {
    /// The registered array.
    #[getter]
    fn array(&self, py: Python<'_>) -> Py<PyAny> {
        self.array.clone_ref(py)
    }

    /// Whether it is still registered.
    #[getter]
    fn registered(&self) -> bool {
        lock(&self.window).is_some()
    }

    /// Whether the peers mapped it (all-reduces may read it in place); false where some rank's
    /// memory could not be exported (the registration is recorded and calls copy).
    #[getter]
    fn zero_copy(&self) -> bool {
        lock(&self.window).as_ref().is_some_and(Option::is_some)
    }
}

/// `Communicator.register` (documented there).
pub(super) fn register(
    comm: &Communicator,
    py: Python<'_>,
    tensor: &Bound<'_, PyAny>,
) -> PyResult<RegisteredBuffer> {
    let inner = comm.inner()?;
    if inner.host() {
        return Err(crate::errors::new(
            crate::errors::Kind::Unavailable,
            "register: the host backend maps only memory it allocated itself (shared \
             memory), not arrays of the process heap such as NumPy's; its collectives \
             need no registration",
        ));
    }
    let v = inner.view(tensor, "register", None)?;
    if v.nbytes() == 0 {
        return Err(usage("register: an empty array"));
    }
    let buffer = inner.wrap(&v)?;
    inner.colls("register")?;
    let slice = buffer.full();
    let inner2 = inner.clone();
    let window = py.detach(move || match inner2.caller.collectives() {
        Some(c) => register_agreed(c, &slice),
        None => Err(mscclpp::hal::Error::unavailable(
            "registering a buffer",
            "a communicator of one rank has no collectives to register with",
        )),
    });
    let window = window.py_err()?;
    let range = (buffer.ptr().0, buffer.len() as u64);
    // Only a mapped buffer lets an all-reduce read its input in place.
    if window.is_some() {
        lock(&inner.registered).push(range);
    }
    Ok(RegisteredBuffer {
        window: Mutex::new(Some(window)),
        range,
        _buffer: buffer,
        array: tensor.clone().unbind(),
    })
}

/// Registers `slice` for zero copy where every rank can export its buffer, else records it
/// (`None`) on every rank, logging which ranks could not and this rank's reason.
fn register_agreed(
    c: &dyn mscclpp::collectives::AnyCollectives,
    slice: &BufferSlice,
) -> mscclpp::hal::Result<Option<Window>> {
    let comm = c.communicator();
    // The export the peers' mapping starts with, tried alone (cheap: the handle is cached).
    let mine = comm
        .register_memory(slice, TransportFlags::single(Transport::CudaIpc))
        .err();
    let all = comm.bootstrap().all_gather(&[u8::from(mine.is_none())])?;
    let missing: Vec<usize> = (0..all.len()).filter(|&r| all[r] != [1]).collect();
    if missing.is_empty() {
        return c.register(slice).map(Some);
    }
    let why = mine.map_or_else(String::new, |e| format!("; this rank's: {e}"));
    tracing::info!(
        rank = comm.rank(),
        "register: ranks {missing:?} cannot export their buffer to the peers (memory of the \
         virtual-memory calls, such as PyTorch's expandable segments, or of several mappings, \
         has no IPC handle){why}; the registration is recorded and calls on it copy"
    );
    Ok(None)
}

/// `Communicator.deregister` (documented there).
pub(super) fn deregister(
    comm: &Communicator,
    py: Python<'_>,
    buffer: &RegisteredBuffer,
) -> PyResult<()> {
    let inner = comm.inner()?;
    let w = lock(&buffer.window)
        .take()
        .ok_or_else(|| usage("deregister: this buffer is not registered (any more)"))?;
    {
        let mut reg = lock(&inner.registered);
        if let Some(i) = reg.iter().position(|r| *r == buffer.range) {
            reg.swap_remove(i);
        }
    }
    // A recorded registration was recorded on every rank (the choice was collective): there is
    // no mapping to take down, and no collective step.
    let Some(w) = w else { return Ok(()) };
    inner.colls("deregister")?;
    py.detach(move || match inner.caller.collectives() {
        Some(c) => c.deregister(w),
        None => Ok(()),
    })
    .py_err()
}
