//! Registered buffers: arrays every rank's collectives map once, so that all-reduces read them
//! in place on the peers.
//!
//! Which ranks can map their buffer, and the choice every rank then takes together, is the
//! caller side's (`caller/src/windows.rs`, shared with NCCL's `ncclCommWindowRegister`): memory
//! the peers cannot map (PyTorch's expandable segments, made with the virtual-memory calls and
//! possibly of several mappings, have no IPC handle) is recorded, and calls on it copy.

use std::sync::Mutex;

use mscclpp::collectives::Window;
use mscclpp::hal::DeviceBuffer;
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
    inner.require("register")?;
    let slice = buffer.full();
    let inner2 = inner.clone();
    let window = py.detach(move || inner2.caller.register(Some(&slice)));
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
    py.detach(move || inner.caller.deregister(w)).py_err()
}
