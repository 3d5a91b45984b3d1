//! A call's arrays: the stream it runs on, each array read and checked against the
//! communicator's device, its memory wrapped, and the element type of the call.

use std::sync::Arc;

use mscclpp::hal::{BackendKind, BufferSlice, DataType, DeviceBuffer, Stream};
use pyo3::prelude::*;

use super::Inner;
use crate::array::{self, ArrayView, Elem, Place};
use crate::errors::{IntoPy, usage};

fn place_name(p: Place) -> String {
    match p {
        Place::Host => "host memory".into(),
        Place::Gpu { vendor, ordinal } if ordinal == usize::MAX => format!("{vendor} memory"),
        Place::Gpu { vendor, ordinal } => format!("{vendor}:{ordinal}"),
    }
}

impl Inner {
    /// The stream of a call: the communicator's own on the host backend, else the caller's
    /// (`explicit`, else the current stream of `like`'s library), wrapped once per handle.
    pub(super) fn stream(
        &self,
        like: &Bound<'_, PyAny>,
        explicit: Option<u64>,
    ) -> PyResult<(Arc<dyn Stream>, Option<u64>)> {
        if self.host() {
            return Ok((self.caller.stream(explicit).py_err()?, None));
        }
        let h = match explicit {
            Some(h) => h,
            None => array::current_stream(like)?,
        };
        Ok((self.caller.stream(Some(h)).py_err()?, Some(h)))
    }

    /// Reads `obj` and checks that its memory belongs to this communicator's device.
    pub(super) fn view(
        &self,
        obj: &Bound<'_, PyAny>,
        what: &str,
        stream: Option<u64>,
    ) -> PyResult<ArrayView> {
        let v = array::view(obj, what, stream)?;
        let info = self.device().info();
        let ok = match (v.place, info.backend) {
            (Place::Host, BackendKind::Host) => true,
            (Place::Gpu { vendor, ordinal }, b) => {
                vendor == b && (ordinal == usize::MAX || ordinal == info.ordinal)
            }
            _ => false,
        };
        if !ok {
            let mine = match info.backend {
                BackendKind::Host => "the host backend (host memory: NumPy, CPU tensors)".into(),
                b => format!("{b}:{}", info.ordinal),
            };
            return Err(usage(format!(
                "{what}: an array in {}, but this communicator runs on {mine}",
                place_name(v.place)
            )));
        }
        Ok(v)
    }

    /// Wraps a view's memory (not copied, not owned).
    pub(super) fn wrap(&self, v: &ArrayView) -> PyResult<DeviceBuffer> {
        // SAFETY: the view describes the memory of a live caller object on this device (checked
        // by `view`); the caller keeps it alive until the call has run on its stream, as
        // documented on every call.
        unsafe { self.caller.wrap(v.ptr, v.nbytes()) }.py_err()
    }

    /// A view's memory as a slice for a call (not copied, not owned).
    pub(super) fn wrap_slice(&self, v: &ArrayView) -> PyResult<BufferSlice> {
        // SAFETY: as for `wrap`.
        unsafe { self.caller.wrap_slice(v.ptr, v.nbytes()) }.py_err()
    }

    /// Wraps a call's input and output views (one wrapper when they are the same range).
    pub(super) fn wrap_pair(
        &self,
        vin: &ArrayView,
        vout: &ArrayView,
    ) -> PyResult<(BufferSlice, BufferSlice)> {
        // SAFETY: as for `wrap`, for both views.
        unsafe {
            self.caller
                .wrap_pair((vin.ptr, vin.nbytes()), (vout.ptr, vout.nbytes()))
        }
        .py_err()
    }
}

/// The element type of a call over `views`: `dtype` when given (of the arrays' element size),
/// else the arrays' common type.
pub(super) fn call_dtype(
    views: &[(&str, &ArrayView)],
    dtype: Option<DataType>,
    reduces: bool,
) -> PyResult<DataType> {
    let (first_name, first) = views[0];
    for (name, v) in &views[1..] {
        if v.elem.size() != first.elem.size() || (dtype.is_none() && v.elem != first.elem) {
            // Two raw types of one size count as different: their names are unknown.
            return Err(usage(format!(
                "{first_name} is {} but {name} is {}: both must have the same element type",
                first.elem.name(),
                v.elem.name()
            )));
        }
    }
    match (dtype, first.elem) {
        (Some(t), e) if t.size() != e.size() => Err(usage(format!(
            "dtype={}: {} bytes per element, but {first_name} is {} ({} bytes)",
            array::dtype_name(t),
            t.size(),
            e.name(),
            e.size()
        ))),
        (Some(t), _) => Ok(t),
        (None, Elem::Known(t)) => Ok(t),
        (None, Elem::Bool) if reduces => Err(usage(
            "bool arrays cannot be reduced (pass dtype=\"uint8\" to reduce their bytes)",
        )),
        (None, Elem::Bool) => Ok(DataType::U8),
        (None, Elem::Raw { size }) => Err(usage(format!(
            "{first_name}: its element type ({size} bytes: int16, uint16, complex or another \
             float8 format) has no collective here; pass dtype= to move or reduce it as a type \
             of the same size"
        ))),
    }
}
