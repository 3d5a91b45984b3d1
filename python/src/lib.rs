//! `mscclpp_rs._native`: the extension module under the `mscclpp_rs` package (which adds the
//! exception classes, the stubs and the benchmark in Python).
#![deny(unsafe_op_in_unsafe_fn)]

mod array;
mod channels;
mod comm;
mod dlpack;
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

/// Raises unless the real NCCL, about to be loaded by `what` (torch.distributed in the
/// benchmark), cannot create NVLink multicast objects where this process has them disabled
/// (`MSCCLPP_FORCE_DISABLE_NVLS`, `MSCCLPP_DISABLE_NVLS`, `NCCL_NVLS_ENABLE=0`): the check the
/// library makes before it loads NCCL itself.
#[pyfunction]
fn check_nccl_nvls(what: &str) -> PyResult<()> {
    mscclpp::hal::env::check_nccl_nvls(what).map_err(errors::to_py)
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

/// Compiles CUDA/HIP `source` with the library's device headers (`#include
/// "mscclpp/memory_channel.cuh"`, ...) through the backend's run-time compiler (NVRTC, hipRTC)
/// and loads `name`, an `extern "C" __global__` function taking one argument struct by value of
/// `arg_size` bytes (given: compiled now; else at the first launch, by the args' size).
/// `device`: a Communicator (its device) or an ordinal; `backend` as for Communicator. The host
/// backend has no device compiler: UnavailableError.
#[pyfunction]
#[pyo3(signature = (source, name, *, arg_size = None, device = None, backend = None))]
fn compile_kernel(
    py: Python<'_>,
    source: &str,
    name: &str,
    arg_size: Option<usize>,
    device: Option<&Bound<'_, PyAny>>,
    backend: Option<&str>,
) -> PyResult<Py<PyAny>> {
    let dev = match device {
        Some(d) if d.cast::<comm::Communicator>().is_ok() => {
            if backend.is_some() {
                return Err(errors::usage(
                    "compile_kernel: pass backend= with an ordinal device, not with a Communicator",
                ));
            }
            let c = d.cast::<comm::Communicator>()?;
            return Ok(c
                .get()
                .compile_kernel_on(py, source, name, arg_size)?
                .into_pyobject(py)?
                .into_any()
                .unbind());
        }
        Some(d) => {
            let n: usize = d.extract().map_err(|_| {
                errors::usage("compile_kernel: device= expects a Communicator or a device ordinal")
            })?;
            channels::open_device(py, n, backend)?
        }
        None => channels::open_device(py, 0, backend)?,
    };
    Ok(channels::compile(py, dev, source, name, arg_size)?
        .into_pyobject(py)?
        .into_any()
        .unbind())
}

/// Allocates `nbytes` of device memory of the library (zeroed; shared memory on the host
/// backend) without a communicator: what MSCCL++'s `RawGpuBuffer` is. `device`: an ordinal
/// (default: the backend's current device, else 0); `backend` as for Communicator. Peers map it
/// once a communicator of the same device registers or channels it.
#[pyfunction]
#[pyo3(signature = (nbytes, *, device = None, backend = None))]
fn alloc(
    py: Python<'_>,
    nbytes: usize,
    device: Option<usize>,
    backend: Option<&str>,
) -> PyResult<channels::Buffer> {
    let ordinal = match device {
        Some(d) => d,
        None => {
            let kind = backend
                .map(|b| b.parse::<BackendKind>())
                .transpose()
                .map_err(|e| errors::usage(e.to_string()))?;
            py.detach(move || -> mscclpp::hal::Result<usize> {
                let b = match kind {
                    Some(k) => mscclpp::registry::probe(k)?,
                    None => mscclpp::registry::select()?,
                };
                Ok(b.current_device()?.unwrap_or(0))
            })
            .map_err(errors::to_py)?
        }
    };
    let dev = channels::open_device(py, ordinal, backend)?;
    let stream = py.detach(|| dev.create_stream()).map_err(errors::to_py)?;
    channels::Buffer::new(&dev, stream, nbytes)
}

/// A `"dltensor"` capsule over `nbytes` at `ptr` (memory the caller owns and keeps alive), of
/// `dtype`, on `backend`'s device `ordinal`: how `mscclpp.Algorithm.execute` hands raw
/// addresses to the collectives. Nothing is checked about the memory: internal.
#[pyfunction]
#[pyo3(signature = (ptr, nbytes, dtype, backend, ordinal))]
fn _pointer_capsule<'py>(
    py: Python<'py>,
    ptr: u64,
    nbytes: usize,
    dtype: &Bound<'py, PyAny>,
    backend: &str,
    ordinal: usize,
) -> PyResult<Bound<'py, pyo3::types::PyCapsule>> {
    let kind = backend
        .parse::<BackendKind>()
        .map_err(|e| errors::usage(e.to_string()))?;
    let t = array::parse_dtype(dtype)?;
    let shape = dlpack::typed_shape(nbytes, t.size(), None, None)?;
    dlpack::capsule(
        py,
        ptr,
        shape,
        None,
        dlpack::dl_type(t),
        dlpack::device_of(kind, ordinal),
        None,
    )
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // `MSCCLPP_LOG_LEVEL` / `MSCCLPP_DEBUG` (else RUST_LOG, else warn), to standard error.
    mscclpp::init_logging();
    m.add_class::<comm::Communicator>()?;
    m.add_class::<comm::PyUniqueId>()?;
    m.add_class::<comm::Group>()?;
    m.add_class::<comm::ExpertExchange>()?;
    m.add_class::<comm::RegisteredBuffer>()?;
    m.add_class::<channels::Buffer>()?;
    m.add_class::<channels::MemorySemaphore>()?;
    m.add_class::<channels::HostSemaphore>()?;
    m.add_class::<channels::MemoryChannel>()?;
    m.add_class::<channels::PortChannel>()?;
    m.add_class::<channels::Kernel>()?;
    m.add_function(wrap_pyfunction!(compile_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(alloc, m)?)?;
    m.add_function(wrap_pyfunction!(_pointer_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(probe_backends, m)?)?;
    m.add_function(wrap_pyfunction!(default_backend, m)?)?;
    m.add_function(wrap_pyfunction!(compiled_backends, m)?)?;
    m.add_function(wrap_pyfunction!(check_nccl_nvls, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
