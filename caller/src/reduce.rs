//! `reduce` (NCCL's `ncclReduce`): the collectives have no rooted reduction, so it runs as
//! all-reduces of at most [`REDUCE_CHUNK_BYTES`], into the root's output on the root and into
//! the communicator's sink elsewhere. The same calls run on every rank (so the same algorithms),
//! stream-ordered, with no host synchronisation and nothing allocated: capturable.

use mscclpp_collectives::{CollectiveCall, CollectiveKind};
use mscclpp_hal::{
    BufferSlice, DataType, DeviceBuffer, DynStream, Error, MemoryKind, ReduceOp, Result,
};

use crate::{Caller, Tuning};

/// Bytes of the all-reduces a reduce is made of (the last may be shorter); the size of the
/// sink each communicator with collectives allocates when it is made (not while a stream may be
/// capturing).
pub const REDUCE_CHUNK_BYTES: usize = 8 << 20;

/// Where the ranks other than the root leave each chunk's result.
pub(crate) fn sink(caller_device: &dyn mscclpp_hal::Device) -> Result<DeviceBuffer> {
    caller_device.alloc(REDUCE_CHUNK_BYTES, MemoryKind::Device)
}

/// A reduce as a caller names it: raw addresses of the communicator's device.
#[derive(Clone, Copy, Debug)]
pub struct ReduceCall {
    /// This rank's input: `count` elements.
    pub send: u64,
    /// The root's output: `count` elements (read on the root only).
    pub recv: u64,
    /// Elements.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction operator.
    pub op: ReduceOp,
    /// The rank that receives the result.
    pub root: usize,
}

impl Caller {
    /// Enqueues `call` on `stream` (then [`Caller::finish`]): checks the root and the size,
    /// wraps the caller's memory and runs the all-reduces (with one rank, a copy on the root).
    ///
    /// # Safety
    /// As for [`Caller::wrap`]: `count` elements at `send` on every rank, and at `recv` on the
    /// root, alive until the call has run on `stream`.
    pub unsafe fn reduce(
        &self,
        call: &ReduceCall,
        tuning: Tuning,
        stream: &DynStream,
    ) -> Result<()> {
        let (rank, n) = (self.comm.rank(), self.comm.nranks());
        self.check_root("reduce", call.root)?;
        if call.count == 0 {
            return Ok(());
        }
        let (block, _) = crate::buffer_bytes(CollectiveKind::AllReduce, call.count, call.dtype, n)?;
        // SAFETY: forwarded contract.
        let input = unsafe { self.wrap_slice(call.send, block)? };
        let output = if call.root == rank {
            // SAFETY: forwarded contract (the root's output).
            Some(unsafe { self.wrap_slice(call.recv, block)? })
        } else {
            None
        };
        self.reduce_slices(&input, output.as_ref(), call, tuning, stream)?;
        self.finish(stream)
    }

    fn reduce_slices(
        &self,
        input: &BufferSlice,
        output: Option<&BufferSlice>,
        call: &ReduceCall,
        tuning: Tuning,
        stream: &DynStream,
    ) -> Result<()> {
        let guard = self.live()?;
        let Some(colls) = guard.as_ref() else {
            if self.comm.nranks() > 1 {
                return Err(self.unavailable("reduce"));
            }
            // One rank: a copy on the root (in place: nothing to do).
            return match output {
                Some(o) if o.ptr() != input.ptr() => stream.copy(o, input),
                _ => Ok(()),
            };
        };
        let sink = self
            .reduce_sink
            .as_ref()
            .ok_or_else(|| Error::Internal("reduce without its sink buffer".into()))?;
        let esz = call.dtype.size();
        let chunk = (REDUCE_CHUNK_BYTES / esz).max(1);
        let mut at = 0;
        while at < call.count {
            let m = chunk.min(call.count - at);
            let range = at * esz..(at + m) * esz;
            let i = input.slice(range.clone())?;
            let o = match output {
                Some(o) => o.slice(range)?,
                None => sink.slice(..m * esz)?,
            };
            let c =
                CollectiveCall::new(CollectiveKind::AllReduce, &i, &o, m, call.dtype).op(call.op);
            tuning.apply(CollectiveKind::AllReduce, |algorithm| {
                colls.run(&c.algorithm(algorithm), stream)
            })?;
            at += m;
        }
        Ok(())
    }
}
