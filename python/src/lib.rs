//! `mscclpp_rs._native`: the extension module under the `mscclpp_rs` package (which adds the
//! exception classes, the stubs and the benchmark in Python).
#![deny(unsafe_op_in_unsafe_fn)]

mod array;
mod comm;
mod errors;

use mscclpp::hal::BackendKind;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Probes every backend: `{"cuda": None | "why not", "rocm": ..., "host": None}` (`None`: usable).
#[pyfunction]
fn probe_backends(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let outcomes = py.detach(mscclpp::registry::probe_all);
    let d = PyDict::new(py);
    for o in outcomes {
        d.set_item(o.kind.to_string(), o.result.err().map(|e| e.to_string()))?;
    }
    Ok(d)
}

/// The backend a communicator picks by default (`MSCCLPP_BACKEND`, else the first usable).
#[pyfunction]
fn default_backend(py: Python<'_>) -> PyResult<String> {
    let b = py
        .detach(mscclpp::registry::select)
        .map_err(errors::to_py)?;
    Ok(b.kind().to_string())
}

/// The names of the backends compiled in.
#[pyfunction]
fn compiled_backends() -> Vec<String> {
    BackendKind::ALL
        .into_iter()
        .filter(|&k| mscclpp::registry::is_compiled(k))
        .map(|k| k.to_string())
        .collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // `MSCCLPP_LOG_LEVEL` / `MSCCLPP_DEBUG` (else RUST_LOG, else warn), to standard error.
    mscclpp::init_logging();
    m.add_class::<comm::Communicator>()?;
    m.add_class::<comm::PyUniqueId>()?;
    m.add_class::<comm::Group>()?;
    m.add_class::<comm::RegisteredBuffer>()?;
    m.add_function(wrap_pyfunction!(probe_backends, m)?)?;
    m.add_function(wrap_pyfunction!(default_backend, m)?)?;
    m.add_function(wrap_pyfunction!(compiled_backends, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
