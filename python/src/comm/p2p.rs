//! Sends and receives: one batch of them on one stream, and `group()`, which queues them until
//! it closes.

use mscclpp::collectives::{P2pKind, P2pOp};
use mscclpp::hal::BufferSlice;
use pyo3::prelude::*;

use super::{Communicator, lock};
use crate::errors::{IntoPy, usage};

/// A send or receive queued in a `group()`.
#[derive(Debug)]
pub(super) struct Pending {
    kind: P2pKind,
    obj: Py<PyAny>,
    peer: usize,
    stream: Option<u64>,
}

impl Communicator {
    fn p2p(
        &self,
        py: Python<'_>,
        ops: &[(P2pKind, Bound<'_, PyAny>, usize, Option<u64>)],
    ) -> PyResult<()> {
        let inner = self.inner()?;
        let n = inner.comm().nranks();
        let Some(first) = ops.first() else {
            return Ok(());
        };
        if let Some(o) = ops.iter().find(|o| o.3 != first.3) {
            return Err(usage(format!(
                "the sends and receives of one group run on one stream: stream={:?} and stream={:?} were given",
                first.3, o.3
            )));
        }
        let (s, handle) = inner.stream(&first.1, first.3)?;
        let mut buffers = Vec::with_capacity(ops.len());
        for (kind, obj, peer, _) in ops {
            let what = if *kind == P2pKind::Send {
                "send"
            } else {
                "recv"
            };
            if *peer >= n {
                return Err(usage(format!("{what}: peer {peer} is not a rank of {n}")));
            }
            let v = inner.view(obj, what, handle)?;
            let buf = if v.nbytes() == 0 {
                None
            } else {
                Some(inner.wrap_slice(&v)?)
            };
            buffers.push((*kind, *peer, buf, v.nbytes()));
        }
        inner.require("send/recv")?;
        py.detach(move || {
            let slices: Vec<(P2pKind, usize, BufferSlice, usize)> = buffers
                .iter()
                .filter_map(|(k, p, b, bytes)| b.as_ref().map(|b| (*k, *p, b.clone(), *bytes)))
                .collect();
            let ops: Vec<P2pOp> = slices
                .iter()
                .map(|(kind, peer, buffer, bytes)| P2pOp {
                    kind: *kind,
                    peer: *peer,
                    buffer,
                    bytes: *bytes,
                })
                .collect();
            inner.caller.send_recv(&ops, &*s)
        })
        .py_err()
    }

    pub(super) fn send_or_queue(
        &self,
        py: Python<'_>,
        kind: P2pKind,
        obj: &Bound<'_, PyAny>,
        peer: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        {
            let mut g = lock(&self.group);
            if let Some(pending) = g.as_mut() {
                pending.push(Pending {
                    kind,
                    obj: obj.clone().unbind(),
                    peer,
                    stream,
                });
                return Ok(());
            }
        }
        self.p2p(py, &[(kind, obj.clone(), peer, stream)])
    }
}

/// The context manager `Communicator.group()` returns.
#[pyclass(module = "mscclpp_rs")]
#[derive(Debug)]
pub struct Group {
    pub(super) comm: Py<Communicator>,
}

#[pymethods]
impl Group {
    fn __enter__(slf: PyRef<'_, Self>) -> PyResult<PyRef<'_, Self>> {
        {
            let comm = slf.comm.get();
            let mut g = lock(&comm.group);
            if g.is_some() {
                return Err(usage("a group() is already open on this communicator"));
            }
            *g = Some(Vec::new());
        }
        Ok(slf)
    }

    #[pyo3(signature = (exc_type = None, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let comm = self.comm.get();
        let pending = lock(&comm.group).take().unwrap_or_default();
        if exc_type.is_some_and(|t| !t.is_none()) {
            // The body failed: its sends and receives are dropped, the exception goes on.
            return Ok(false);
        }
        let ops: Vec<_> = pending
            .into_iter()
            .map(|p| (p.kind, p.obj.into_bound(py), p.peer, p.stream))
            .collect();
        comm.p2p(py, &ops)?;
        Ok(false)
    }
}
