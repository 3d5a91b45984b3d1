//! One collective call, as every caller describes it, and the checks every algorithm relies on.

use mscclpp_hal::{BufferSlice, DataType, Error, ReduceOp, Result};

use crate::CollectiveKind;

/// One collective call: what [`crate::Collectives::run`] enqueues.
///
/// `count` is the elements of one rank block: all-reduce and broadcast move `count` elements,
/// all-gather gathers `count` from every rank, reduce-scatter leaves `count` per rank, all-to-all
/// sends `count` to every rank. `op` matters only to reductions, `root` only to broadcast.
#[derive(Debug, Clone, Copy)]
pub struct CollectiveCall<'a> {
    /// The collective.
    pub kind: CollectiveKind,
    /// This rank's input.
    pub input: &'a BufferSlice,
    /// This rank's output (the same memory as `input`, or the block of it the collective
    /// names, for in place).
    pub output: &'a BufferSlice,
    /// Elements per rank block.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction operator (all-reduce, reduce-scatter).
    pub op: ReduceOp,
    /// Root rank (broadcast).
    pub root: usize,
    /// The caller's promise that every rank's input lies in a buffer registered with
    /// [`crate::Collectives::register`] whenever this rank's does (NCCL's rule for registered
    /// buffers). It lets an all-reduce of a registered input take the zero-copy read path where
    /// that path serves ([`crate::Collectives::run`]); without it, registration never changes
    /// the algorithm, so ranks may differ in what they registered.
    pub registered: bool,
    /// The algorithm this call must take (the API's counterpart of `MSCCLPP_ALGO_*`), or
    /// `None` to leave the choice to the policy. Every rank must make the same choice for a
    /// call; one that cannot serve the call here is an error naming it.
    pub algorithm: Option<crate::AlgorithmId>,
}

impl<'a> CollectiveCall<'a> {
    /// A call of `kind` with the sum and root 0 (set [`Self::op`], [`Self::root`] as needed).
    pub fn new(
        kind: CollectiveKind,
        input: &'a BufferSlice,
        output: &'a BufferSlice,
        count: usize,
        dtype: DataType,
    ) -> Self {
        CollectiveCall {
            kind,
            input,
            output,
            count,
            dtype,
            op: ReduceOp::Sum,
            root: 0,
            registered: false,
            algorithm: None,
        }
    }

    /// With the reduction operator `op`.
    pub fn op(self, op: ReduceOp) -> Self {
        CollectiveCall { op, ..self }
    }

    /// With the root `root`.
    pub fn root(self, root: usize) -> Self {
        CollectiveCall { root, ..self }
    }

    /// Taking `algorithm` (see [`CollectiveCall::algorithm`]; `None`: the policy's choice).
    pub fn algorithm(self, algorithm: Option<crate::AlgorithmId>) -> Self {
        CollectiveCall { algorithm, ..self }
    }

    /// With the promise of [`CollectiveCall::registered`].
    pub fn registered(self, registered: bool) -> Self {
        CollectiveCall { registered, ..self }
    }
}

/// A call checked against the communicator: what the algorithms plan and launch from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checked<'a> {
    pub call: &'a CollectiveCall<'a>,
    pub rank: usize,
    pub nranks: usize,
    /// Bytes of the input and of the output.
    pub in_bytes: u64,
    pub out_bytes: u64,
    /// Bytes of one rank block (`count` elements).
    pub block_bytes: u64,
}

impl Checked<'_> {
    pub fn kind(&self) -> CollectiveKind {
        self.call.kind
    }

    /// Bytes of the larger buffer.
    pub fn buffer_bytes(&self) -> u64 {
        self.in_bytes.max(self.out_bytes)
    }

    /// Index of the reducing kernels of this element type and operator (`dtype * 5 + op`).
    pub fn reduce_index(&self) -> usize {
        self.call.dtype as usize * ReduceOp::ALL.len() + self.call.op as usize
    }
}

/// Checks `call` for rank `rank` of `nranks` on `backend`: the root, the sizes (no overflow,
/// buffers large enough), the backend of the buffers, and overlap (only the in-place forms).
pub(crate) fn check<'a>(
    call: &'a CollectiveCall<'a>,
    rank: usize,
    nranks: usize,
    backend: mscclpp_hal::BackendKind,
) -> Result<Checked<'a>> {
    let CollectiveCall {
        kind,
        input,
        output,
        count,
        dtype,
        root,
        ..
    } = *call;
    let name = kind.name();
    if root >= nranks {
        return Err(Error::invalid(format!(
            "{name}: root {root} is not a rank of {nranks}"
        )));
    }
    let (in_elems, out_elems) = kind.buffer_elements(count as u64, nranks as u64);
    let need = |elems: u64| {
        elems
            .checked_mul(dtype.size() as u64)
            .filter(|b| *b <= isize::MAX as u64)
            .ok_or_else(|| Error::invalid(format!("{name}: count {count} of {dtype} overflows")))
    };
    let (in_bytes, out_bytes) = (need(in_elems)?, need(out_elems)?);
    for (what, s, bytes) in [("input", input, in_bytes), ("output", output, out_bytes)] {
        if (s.len() as u64) < bytes {
            return Err(Error::invalid(format!(
                "{name}: {what} of {} bytes is too small for {count} {dtype} elements ({bytes} bytes needed on {nranks} ranks)",
                s.len()
            )));
        }
        if s.buffer().backend() != backend {
            return Err(Error::invalid(format!(
                "{name}: {what} belongs to the {} backend, the communicator to {backend}",
                s.buffer().backend(),
            )));
        }
    }
    let (i0, o0) = (input.ptr().0, output.ptr().0);
    if i0 < o0 + out_bytes && o0 < i0 + in_bytes {
        let (ok, in_place) = match kind {
            CollectiveKind::AllReduce | CollectiveKind::Broadcast => (i0 == o0, "the same buffer"),
            CollectiveKind::AllGather => (
                i0 == o0 + rank as u64 * in_bytes,
                "input = output block `rank`",
            ),
            CollectiveKind::ReduceScatter => (
                o0 == i0 + rank as u64 * out_bytes,
                "output = input block `rank`",
            ),
            // Every algorithm sends a piece of input block `p` before it stores what it received
            // from `p` over it (the same thread, or after a block-wide wait), and a rank's own
            // block stays where it is.
            CollectiveKind::AllToAll => (i0 == o0, "the same buffer"),
        };
        if !ok {
            return Err(Error::invalid(format!(
                "{name}: input and output overlap in a way the collective does not support (in place means: {in_place})"
            )));
        }
    }
    Ok(Checked {
        call,
        rank,
        nranks,
        in_bytes,
        out_bytes,
        block_bytes: count as u64 * dtype.size() as u64,
    })
}
