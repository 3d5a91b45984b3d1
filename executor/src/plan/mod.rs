//! The plan reader: MSCCL++ JSON execution plans (what `mscclpp.language` emits) decoded into
//! typed structs and validated, with errors that name the field by its path
//! (`gpus[1].threadblocks[0].ops[3].src_buff[1].index`).
//!
//! A plan is untrusted input (a file a user points us at): decoding never panics, the input is
//! bounded in bytes (so every vector it produces is bounded too), nesting is bounded by
//! `serde_json`'s recursion limit, and every count the executor turns into device records is
//! checked against the limits (`limits`, re-exported here).
//!
//! The reader is split by what each part knows: `types` the typed plan, `json` the
//! path-carrying field accessors, `decode` the walk from JSON to the types (ranks and
//! threadblocks, then operations), `validate` the checks of decoded values against what the
//! interpreter needs. This file holds the entry points.

mod decode;
mod json;
mod limits;
mod types;
mod validate;

use mscclpp_hal::{Error, Result};
use serde_json::Value;

pub use limits::*;
pub use types::{
    BufRef, BufferType, ChannelDef, ChannelType, Gpu, Op, OpKind, PipelineInfo, Plan, Protocol,
    RemoteBuffer, Target, Threadblock,
};

impl Plan {
    /// Decodes and validates a plan for a communicator of `nranks` ranks.
    pub fn from_bytes(bytes: &[u8], nranks: usize) -> Result<Plan> {
        if bytes.len() > MAX_PLAN_BYTES {
            return Err(Error::invalid(format!(
                "execution plan of {} bytes: at most {MAX_PLAN_BYTES} are accepted",
                bytes.len()
            )));
        }
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::invalid(format!("execution plan is not valid JSON: {e}")))?;
        Plan::from_value(&v, nranks)
    }

    /// Reads, decodes and validates the plan in file `path`.
    pub fn from_file(path: &std::path::Path, nranks: usize) -> Result<Plan> {
        let meta = std::fs::metadata(path)
            .map_err(|e| Error::io(format!("reading execution plan {}", path.display()), e))?;
        if meta.len() > MAX_PLAN_BYTES as u64 {
            return Err(Error::invalid(format!(
                "execution plan {} has {} bytes: at most {MAX_PLAN_BYTES} are accepted",
                path.display(),
                meta.len()
            )));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io(format!("reading execution plan {}", path.display()), e))?;
        Plan::from_bytes(&bytes, nranks)
            .map_err(|e| e.with_context(|| format!("plan file {}", path.display())))
    }

    /// Validates a decoded JSON value as a plan for `nranks` ranks.
    pub fn from_value(v: &Value, nranks: usize) -> Result<Plan> {
        decode::plan(v, nranks)
    }
}
