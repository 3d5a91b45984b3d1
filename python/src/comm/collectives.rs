//! The collectives' common path: reduction op names, and one call's checks of its arrays and
//! counts before it is enqueued.

use mscclpp::collectives::{CollectiveCall, CollectiveKind};
use mscclpp::hal::ReduceOp;
use pyo3::prelude::*;

use super::Communicator;
use super::arrays::call_dtype;
use crate::array;
use crate::errors::{IntoPy, usage};

pub(super) fn parse_op(op: &str) -> PyResult<ReduceOp> {
    match op.to_ascii_lowercase().as_str() {
        "sum" => Ok(ReduceOp::Sum),
        "prod" | "product" => Ok(ReduceOp::Prod),
        "min" => Ok(ReduceOp::Min),
        "max" => Ok(ReduceOp::Max),
        "avg" | "mean" => Ok(ReduceOp::Avg),
        _ => Err(usage(format!(
            "unknown reduction op {op:?}: expected \"sum\", \"prod\", \"min\", \"max\" or \"avg\""
        ))),
    }
}

impl Communicator {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn collective(
        &self,
        py: Python<'_>,
        kind: CollectiveKind,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        op: ReduceOp,
        root: usize,
        stream: Option<u64>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let inner = self.inner()?;
        let n = inner.comm().nranks();
        let name = match kind {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::AllToAll => "all_to_all",
        };
        if kind == CollectiveKind::Broadcast && root >= n {
            return Err(usage(format!("{name}: root {root} is not a rank of {n}")));
        }
        let (s, handle) = inner.stream(output, stream)?;
        let vin = inner.view(input, "input", handle)?;
        let vout = inner.view(output, "output", handle)?;
        let dtype = dtype.map(array::parse_dtype).transpose()?;
        let reduces = matches!(
            kind,
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
        );
        let dt = call_dtype(&[("input", &vin), ("output", &vout)], dtype, reduces)?;
        let (count, want_in, want_out) = match kind {
            CollectiveKind::AllReduce | CollectiveKind::Broadcast => (vin.len, vin.len, vin.len),
            CollectiveKind::AllGather => (vin.len, vin.len, vin.len * n),
            CollectiveKind::ReduceScatter => (vout.len, vout.len * n, vout.len),
            CollectiveKind::AllToAll => {
                if vin.len % n != 0 {
                    return Err(usage(format!(
                        "{name}: input of {} elements is not {n} equal blocks (one per rank)",
                        vin.len
                    )));
                }
                (vin.len / n, vin.len, vin.len)
            }
        };
        if vin.len != want_in || vout.len != want_out {
            return Err(usage(format!(
                "{name} over {n} ranks: input of {} and output of {} elements were given; \
                 {want_in} and {want_out} are needed",
                vin.len, vout.len
            )));
        }
        if count == 0 {
            return Ok(());
        }
        inner.require(name)?;
        let (bin, bout) = inner.wrap_pair(&vin, &vout)?;
        let registered =
            kind == CollectiveKind::AllReduce && inner.is_registered(vin.ptr, vin.nbytes() as u64);
        py.detach(move || {
            let (i, o) = (bin, bout);
            inner.caller.collective(
                &CollectiveCall::new(kind, &i, &o, count, dt)
                    .op(op)
                    .root(root)
                    .registered(registered),
                &*s,
            )
        })
        .py_err()
    }
}
