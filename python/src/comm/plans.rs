//! Execution plans: a plan's JSON from what the caller passed, the decoded plans kept per
//! communicator, and a run of one on two arrays.

use std::sync::Arc;

use mscclpp::executor::Plan;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use super::arrays::call_dtype;
use super::collectives::parse_op;
use super::{Communicator, lock};
use crate::array;
use crate::errors::{IntoPy, usage};

/// Most distinct plans (by JSON text) decoded and kept per communicator.
pub(super) const MAX_PLANS: usize = 64;

/// `bytes`, `str` (a path, or JSON text when it starts with `{`) or `os.PathLike`: the plan's
/// JSON bytes.
fn plan_bytes(plan: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = plan.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    let text = if let Ok(s) = plan.cast::<PyString>() {
        s.to_string()
    } else {
        let os = plan.py().import("os")?;
        os.call_method1("fspath", (plan,))
            .map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err("plan: expected a path, JSON text or bytes")
            })?
            .extract::<String>()?
    };
    if text.trim_start().starts_with('{') {
        return Ok(text.into_bytes());
    }
    std::fs::read(&text).map_err(|e| {
        crate::errors::new(
            crate::errors::Kind::InvalidUsage,
            format!("reading execution plan {text:?}: {e}"),
        )
    })
}

/// `Communicator.execute_plan` (documented there).
#[allow(clippy::too_many_arguments)]
pub(super) fn execute_plan(
    comm: &Communicator,
    py: Python<'_>,
    plan: &Bound<'_, PyAny>,
    send: &Bound<'_, PyAny>,
    recv: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    op: Option<&str>,
    stream: Option<u64>,
) -> PyResult<Py<PyAny>> {
    let inner = comm.inner()?;
    let bytes = plan_bytes(plan)?;
    let op = op.map(parse_op).transpose()?;
    let (s, handle) = inner.stream(recv, stream)?;
    let vin = inner.view(send, "send", handle)?;
    let vout = inner.view(recv, "recv", handle)?;
    let dtype = dtype.map(array::parse_dtype).transpose()?;
    let dt = call_dtype(&[("send", &vin), ("recv", &vout)], dtype, false)?;
    if vin.nbytes() == 0 || vout.nbytes() == 0 {
        return Err(usage("execute_plan: empty send or recv array"));
    }
    let (bin, bout) = inner.wrap_pair(&vin, &vout)?;
    py.detach(move || -> mscclpp::hal::Result<()> {
        let n = inner.comm().nranks();
        let plan = {
            let cached = lock(&inner.plans).get(&bytes).cloned();
            match cached {
                Some(p) => p,
                None => {
                    let p = Arc::new(Plan::from_bytes(&bytes, n)?);
                    let mut plans = lock(&inner.plans);
                    if plans.len() < MAX_PLANS {
                        plans.insert(bytes, p.clone());
                    }
                    p
                }
            }
        };
        // Staged as the plan says (the peers map only the library's own memory), in the
        // communicator's launch order: in place or not, for any pair of arrays.
        let ran = inner
            .caller
            .run_plan(&plan, &bin, &bout, dt, op, &*s)?;
        if ran {
            Ok(())
        } else {
            Err(mscclpp::hal::Error::invalid(format!(
                "execute_plan: {} (plan, size) pairs are staged on this communicator already; its buffers are kept for good, so use fewer sizes or another communicator",
                mscclpp_caller::MAX_STAGED
            )))
        }
    })
    .py_err()?;
    Ok(recv.clone().unbind())
}
