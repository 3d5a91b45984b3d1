//! Opening a communicator: the bootstrap's `UniqueId`, the rendezvous a rank joins by, and the
//! backend and device it picks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use mscclpp::comm::{Bootstrap, BootstrapConfig, Communicator as RawComm, UniqueId as RawId};
use mscclpp::hal::{Backend, BackendKind};
use mscclpp_caller::Caller;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use super::{Communicator, Inner};
use crate::errors::{IntoPy, usage};

/// A bootstrap unique id: the root's address and a random secret. The process that creates it
/// runs the root when it joins as a rank; the others receive it (`bytes(uid)`, pickling) and
/// join with it.
#[pyclass(name = "UniqueId", module = "mscclpp_rs", frozen, eq, hash)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyUniqueId {
    id: RawId,
}

#[pymethods]
impl PyUniqueId {
    /// Creates an id and binds its root listener on `root` (`"ip:port"`, port 0 for any), by
    /// default on this host's address and an ephemeral port.
    #[new]
    #[pyo3(signature = (root = None))]
    fn new(root: Option<&str>) -> PyResult<Self> {
        let id = match root {
            None => RawId::new(),
            Some(r) => {
                let addr: std::net::SocketAddr = r.parse().map_err(|e| {
                    usage(format!(
                        "UniqueId root {r:?} is not an \"ip:port\" address: {e}"
                    ))
                })?;
                RawId::with_root(addr)
            }
        }
        .py_err()?;
        Ok(PyUniqueId { id })
    }

    /// Decodes the 128 bytes of `bytes(uid)`.
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> PyResult<Self> {
        Ok(PyUniqueId {
            id: RawId::from_bytes(data).py_err()?,
        })
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.id.to_bytes())
    }

    /// The root's `"ip:port"`.
    #[getter]
    fn root(&self) -> String {
        self.id.root_addr().to_string()
    }

    fn __repr__(&self) -> String {
        format!("UniqueId(root={:?})", self.root())
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let py = slf.py();
        let from = slf.get_type().getattr("from_bytes")?;
        Ok((from, (slf.get().__bytes__(py),)))
    }
}

pub(super) enum Rendezvous {
    Id(RawId),
    Addr(String),
}

impl Rendezvous {
    /// `Communicator(id, ...)`'s `id`: a `UniqueId`, its bytes or a root address.
    pub(super) fn from_py(id: &Bound<'_, PyAny>) -> PyResult<Self> {
        let how = if let Ok(u) = id.cast::<PyUniqueId>() {
            Rendezvous::Id(u.get().id)
        } else if let Ok(b) = id.cast::<PyBytes>() {
            Rendezvous::Id(RawId::from_bytes(b.as_bytes()).py_err()?)
        } else if let Ok(s) = id.cast::<PyString>() {
            Rendezvous::Addr(s.to_string())
        } else {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "id: expected a UniqueId, its bytes or an \"ip:port\" string, got {}",
                id.get_type().name()?
            )));
        };
        Ok(how)
    }
}

pub(super) fn open(
    py: Python<'_>,
    how: Option<(Rendezvous, usize, usize)>,
    device: Option<usize>,
    backend: Option<&str>,
) -> PyResult<Communicator> {
    let backend_kind = backend
        .map(|b| b.parse::<BackendKind>())
        .transpose()
        .py_err()?;
    let inner = py.detach(move || -> mscclpp::hal::Result<Inner> {
        let cfg = BootstrapConfig::from_env()?;
        let boot = Arc::new(match how {
            None => Bootstrap::from_env(cfg)?,
            Some((Rendezvous::Id(id), rank, size)) => Bootstrap::new(&id, rank, size, cfg)?,
            Some((Rendezvous::Addr(a), rank, size)) => Bootstrap::from_addr(&a, rank, size, cfg)?,
        });
        let backend: Arc<dyn Backend> = match backend_kind {
            Some(k) => mscclpp::registry::probe(k)?,
            None => mscclpp::registry::select()?,
        };
        let count = backend.device_count().max(1);
        let ordinal = match device {
            Some(d) if d >= count => {
                return Err(mscclpp::hal::Error::invalid(format!(
                    "device={d}: the {} backend has {count} device(s)",
                    backend.kind()
                )));
            }
            Some(d) => d,
            None => boot.local_rank().unwrap_or_else(|| boot.host_rank()) % count,
        };
        let dev = backend.open_device(ordinal)?;
        let caller = Caller::new(Arc::new(RawComm::new(boot, dev)))?;
        let comm = caller.communicator();
        tracing::info!(
            rank = comm.rank(),
            nranks = comm.nranks(),
            device = ordinal,
            backend = %comm.device().info().backend,
            "python communicator ready"
        );
        Ok(Inner {
            caller,
            plans: Mutex::new(HashMap::new()),
            registered: Mutex::new(Vec::new()),
        })
    });
    Ok(Communicator {
        inner: RwLock::new(Some(Arc::new(inner.py_err()?))),
        group: Mutex::new(None),
    })
}
