//! Our errors as Python exceptions: the classes live in `mscclpp_rs/_errors.py` (so that they can
//! derive from `ValueError` or `TimeoutError` as well as from `mscclpp_rs.Error`), the messages
//! are the library's own.

use mscclpp::hal::{Error, ErrorClass};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The exception classes, by [`ErrorClass`].
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    InvalidUsage,
    System,
    Remote,
    Timeout,
    Unavailable,
    Internal,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::InvalidUsage => "InvalidUsageError",
            Kind::System => "SystemFailureError",
            Kind::Remote => "RemoteError",
            Kind::Timeout => "TimeoutError",
            Kind::Unavailable => "UnavailableError",
            Kind::Internal => "InternalError",
        }
    }

    fn of(class: ErrorClass) -> Kind {
        match class {
            ErrorClass::InvalidUsage => Kind::InvalidUsage,
            ErrorClass::System => Kind::System,
            ErrorClass::Remote => Kind::Remote,
            ErrorClass::Timeout => Kind::Timeout,
            ErrorClass::Unavailable => Kind::Unavailable,
            ErrorClass::Internal => Kind::Internal,
        }
    }
}

fn errors_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    MODULE
        .get_or_try_init(py, || Ok(py.import("mscclpp_rs._errors")?.unbind()))
        .map(|m| m.bind(py))
}

/// A Python exception of class `kind` carrying `msg`.
pub fn new(kind: Kind, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::attach(|py| {
        let class = match errors_module(py).and_then(|m| m.getattr(kind.class_name())) {
            Ok(c) => c,
            // The package's Python half is missing (the extension imported on its own): the
            // message must still reach the user.
            Err(e) => return e,
        };
        match class.cast_into::<PyType>() {
            Ok(t) => PyErr::from_type(t, msg),
            Err(e) => PyErr::from(e),
        }
    })
}

/// A user mistake found by the bindings themselves.
pub fn usage(msg: impl Into<String>) -> PyErr {
    new(Kind::InvalidUsage, msg)
}

/// Our error as the matching Python exception (with the causes' messages chained in).
pub fn to_py(e: Error) -> PyErr {
    new(Kind::of(e.class()), mscclpp::hal::error::chain(&e))
}

/// `?` on a library result inside the bindings.
pub trait IntoPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for mscclpp::hal::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
