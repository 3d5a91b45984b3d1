//! Graphs of the host backend: a capture records a stream's jobs instead of queueing them, and
//! a graph replays them. Jobs are `Fn` so that a replay runs the same closures again.

use mscclpp_hal::{GraphApi, Result};

use super::queue::{HostStream, Job};

/// A captured sequence of host-stream operations; a replay enqueues them again in order.
pub struct HostGraph {
    ops: Vec<Job>,
}

impl HostGraph {
    /// The graph of the jobs a capture recorded.
    pub(super) fn new(ops: Vec<Job>) -> Self {
        HostGraph { ops }
    }
}

impl std::fmt::Debug for HostGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostGraph")
            .field("ops", &self.ops.len())
            .finish()
    }
}

impl GraphApi for HostGraph {
    type A = crate::Host;

    fn launch(&self, s: &HostStream) -> Result<()> {
        for op in &self.ops {
            s.submit(op.clone())?;
        }
        Ok(())
    }
}
