//! Execution plans on staged buffers.
//!
//! Peers reach a plan's buffers through IPC, which a caller's memory (a raw pointer of any
//! allocator, a NumPy array, a torch tensor) does not offer. So a plan runs on buffers of the
//! library, arranged as the plan says — one buffer for an in-place plan (for an all-gather the
//! input is the rank's block of the output, for a reduce-scatter the output is the rank's block
//! of the input), two otherwise — between a copy in from the caller's input and a copy out to
//! its output. Whether the caller's call is in place then plays no part: an in-place plan serves
//! two distinct arrays, and an out-of-place plan one array. The same buffers serve every call of
//! a (plan, sizes) pair, which keeps the executor's set-up cached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mscclpp_comm::Communicator;
use mscclpp_executor::{Executor, Plan};
use mscclpp_hal::{BufferSlice, DataType, DeviceBuffer, DynStream, MemoryKind, ReduceOp, Result};

/// Most (plan, input bytes, output bytes) triples staged per communicator: each holds its
/// buffers and the executor's set-up for the communicator's life.
pub const MAX_STAGED: usize = 64;

/// A plan's buffers for one size pair.
#[derive(Debug)]
struct Staged {
    _buffers: Vec<DeviceBuffer>,
    send: BufferSlice,
    recv: BufferSlice,
}

#[derive(Debug, Default)]
pub(crate) struct PlanStage {
    executor: Mutex<Option<Arc<Executor>>>,
    staged: Mutex<HashMap<(String, usize, usize), Arc<Staged>>>,
}

impl PlanStage {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The communicator's executor, made at its first use.
    pub(crate) fn executor(&self, comm: &Arc<Communicator>) -> Result<Arc<Executor>> {
        let mut e = self.executor.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(x) = &*e {
            return Ok(x.clone());
        }
        let x = Arc::new(Executor::new(comm.clone())?);
        *e = Some(x.clone());
        Ok(x)
    }

    /// Copy in, execute, copy out (see the module doc); `Ok(false)` when no more sizes can be
    /// staged.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &self,
        comm: &Arc<Communicator>,
        plan: &Plan,
        send: &BufferSlice,
        recv: &BufferSlice,
        dtype: DataType,
        op: Option<ReduceOp>,
        stream: &DynStream,
    ) -> Result<bool> {
        let executor = self.executor(comm)?;
        executor.check(plan, send.len(), recv.len(), dtype)?;
        let Some(staged) = self.staged(comm, plan, send.len(), recv.len())? else {
            return Ok(false);
        };
        stream.copy(&staged.send, send)?;
        executor
            .execute(plan, &staged.send, &staged.recv, dtype, op, stream)
            .map_err(|e| e.with_context(|| format!("execution plan {}", plan.name)))?;
        stream.copy(recv, &staged.recv)?;
        Ok(true)
    }

    fn staged(
        &self,
        comm: &Communicator,
        plan: &Plan,
        ib: usize,
        ob: usize,
    ) -> Result<Option<Arc<Staged>>> {
        let mut map = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        let key = (plan.name.clone(), ib, ob);
        if let Some(s) = map.get(&key) {
            return Ok(Some(s.clone()));
        }
        if map.len() >= MAX_STAGED {
            tracing::debug!(
                "execution plan {} not staged for {ib}/{ob} bytes: {MAX_STAGED} sizes are staged already",
                plan.name
            );
            return Ok(None);
        }
        let device = comm.device();
        let rank = comm.rank();
        let alloc = |bytes: usize| device.alloc(bytes.max(1), MemoryKind::Device);
        let s = if !plan.inplace {
            let (a, b) = (alloc(ib)?, alloc(ob)?);
            Staged {
                send: a.slice(..ib)?,
                recv: b.slice(..ob)?,
                _buffers: vec![a, b],
            }
        } else if ob > ib {
            // All-gather in place: the input is the rank's block of the output.
            let b = alloc(ob)?;
            Staged {
                send: b.slice(rank * ib..(rank + 1) * ib)?,
                recv: b.slice(..ob)?,
                _buffers: vec![b],
            }
        } else if ib > ob {
            // Reduce-scatter in place: the output is the rank's block of the input.
            let a = alloc(ib)?;
            Staged {
                send: a.slice(..ib)?,
                recv: a.slice(rank * ob..(rank + 1) * ob)?,
                _buffers: vec![a],
            }
        } else {
            let a = alloc(ib)?;
            Staged {
                send: a.slice(..ib)?,
                recv: a.slice(..ob)?,
                _buffers: vec![a],
            }
        };
        let s = Arc::new(s);
        map.insert(key, s.clone());
        Ok(Some(s))
    }
}
