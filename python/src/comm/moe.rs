//! `Communicator.expert_exchange(...)`: the expert-parallel exchange
//! (`mscclpp::collectives::moe`, through the caller side's `expert_exchange`) for arrays:
//! the layout of a top-k routing, dispatch and combine, and the counts a dispatch received.

use std::sync::Arc;

use mscclpp::collectives::DataType;
use mscclpp::collectives::moe::{
    AnyMoe, Combine, Dispatch, ExpertMajor, ExpertMajorIn, ExpertScales, Fp8Cast, Halves,
    LayoutOut, MoeConfig,
};
use mscclpp::hal::{BufferSlice, DeviceBuffer, MemoryKind};
use pyo3::prelude::*;

use super::Inner;
use crate::array::{ArrayView, Elem};
use crate::errors::{IntoPy, usage};

/// An expert-parallel exchange of a communicator whose ranks share a host: experts spread
/// evenly (rank r holds experts [r E/n, (r + 1) E/n)), sizes fixed when it is made.
#[pyclass(module = "mscclpp_rs", frozen)]
#[derive(Debug)]
pub struct ExpertExchange {
    inner: Arc<Inner>,
    moe: Arc<dyn AnyMoe>,
    /// What an empty array is given as (a call reads nothing of it).
    empty: DeviceBuffer,
}

fn elem_is(v: &ArrayView, what: &str, want: DataType, name: &str) -> PyResult<()> {
    if v.elem != Elem::Known(want) {
        return Err(usage(format!(
            "{what}: {name} arrays are needed, this one is {}",
            v.elem.name()
        )));
    }
    Ok(())
}

/// A call's halves by name: "both" (default), "send", or "receive" (a later launch that
/// completes a "send" one with the same arrays: DeepEP's receive hook).
fn halves_of(half: Option<&str>) -> PyResult<Halves> {
    match half.unwrap_or("both") {
        "both" => Ok(Halves::Both),
        "send" => Ok(Halves::Send),
        "receive" => Ok(Halves::Receive),
        other => Err(usage(format!(
            "half={other:?}: \"both\", \"send\" or \"receive\""
        ))),
    }
}

/// The element type a combine sums: `x`'s and `out_x`'s, float32, float16 or bfloat16.
fn summed_type(vx: &ArrayView, vo: &ArrayView) -> PyResult<DataType> {
    match (vx.elem, vo.elem) {
        (Elem::Known(a), Elem::Known(b))
            if a == b && matches!(a, DataType::F32 | DataType::F16 | DataType::BF16) =>
        {
            Ok(a)
        }
        _ => Err(usage(format!(
            "combine sums float32, float16 or bfloat16 rows: x is {}, out_x {}",
            vx.elem.name(),
            vo.elem.name()
        ))),
    }
}

/// An optional array's view and slice.
type Opt = Option<(ArrayView, BufferSlice)>;

impl ExpertExchange {
    fn arr(
        &self,
        obj: &Bound<'_, PyAny>,
        what: &str,
        handle: Option<u64>,
    ) -> PyResult<(ArrayView, BufferSlice)> {
        let v = self.inner.view(obj, what, handle)?;
        let s = if v.nbytes() == 0 {
            self.empty.slice(..0).py_err()?
        } else {
            self.inner.wrap_slice(&v)?
        };
        Ok((v, s))
    }

    fn opt(
        &self,
        obj: Option<&Bound<'_, PyAny>>,
        what: &str,
        handle: Option<u64>,
    ) -> PyResult<Opt> {
        obj.map(|o| self.arr(o, what, handle)).transpose()
    }

    fn k(&self) -> usize {
        self.moe.config().topk
    }

    /// Tokens of a `[tokens, topk]` int64 routing.
    fn tokens_of(&self, v: &ArrayView, what: &str) -> PyResult<usize> {
        elem_is(v, what, DataType::I64, "int64")?;
        if v.len % self.k() != 0 {
            return Err(usage(format!(
                "{what}: {} elements are not rows of top-{}",
                v.len,
                self.k()
            )));
        }
        Ok(v.len / self.k())
    }
}

#[pymethods]
impl ExpertExchange {
    /// Experts in all.
    #[getter]
    fn num_experts(&self) -> usize {
        self.moe.config().num_experts
    }

    /// Experts each rank holds.
    #[getter]
    fn local_experts(&self) -> usize {
        self.moe.local_experts()
    }

    /// Experts per token.
    #[getter]
    fn topk(&self) -> usize {
        self.k()
    }

    /// Tokens a rank dispatches in one call, at most.
    #[getter]
    fn max_tokens(&self) -> usize {
        self.moe.config().max_tokens
    }

    /// Bytes of a dispatch's handle (a uint8 array of this size is one).
    #[getter]
    fn handle_bytes(&self) -> usize {
        self.moe.handle_bytes()
    }

    /// Where a handle holds its positions (`[max_tokens, nranks]` int32: the row of each token
    /// at each rank it went to, -1 where it did not), in bytes.
    #[getter]
    fn handle_positions_at(&self) -> usize {
        self.moe.handle_positions_at()
    }

    /// Bytes of the expert-major form's slot table (a uint8 or int32 array of this size).
    #[getter]
    fn slots_bytes(&self) -> usize {
        self.moe.slots_bytes()
    }

    /// Whether the expert-major form (`dispatch_expert_major`, `combine_expert_major`) runs on
    /// this exchange (its ranks on one host).
    #[getter]
    fn expert_major(&self) -> bool {
        self.moe.expert_major().is_ok()
    }

    /// The backend it runs on.
    #[getter]
    fn backend(&self) -> &'static str {
        self.moe.backend()
    }

    /// Counts the routing `topk_idx` (`[tokens, topk]` int64, -1: none) into `per_rank`
    /// (`[nranks]` int32), `per_expert` (`[num_experts]` int32), `in_rank` (`[tokens, nranks]`
    /// bool or uint8) and `status` (`[1]` int32: 1 where an index was out of range).
    #[pyo3(signature = (topk_idx, per_rank, per_expert, in_rank, status, *, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn layout(
        &self,
        py: Python<'_>,
        topk_idx: &Bound<'_, PyAny>,
        per_rank: &Bound<'_, PyAny>,
        per_expert: &Bound<'_, PyAny>,
        in_rank: &Bound<'_, PyAny>,
        status: &Bound<'_, PyAny>,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let (s, h) = self.inner.stream(topk_idx, stream)?;
        let (vi, si) = self.arr(topk_idx, "topk_idx", h)?;
        let tokens = self.tokens_of(&vi, "topk_idx")?;
        let (vr, sr) = self.arr(per_rank, "per_rank", h)?;
        let (ve, se) = self.arr(per_expert, "per_expert", h)?;
        let (vin, sin) = self.arr(in_rank, "in_rank", h)?;
        let (vs, ss) = self.arr(status, "status", h)?;
        for (v, what) in [(&vr, "per_rank"), (&ve, "per_expert"), (&vs, "status")] {
            elem_is(v, what, DataType::I32, "int32")?;
        }
        if !matches!(vin.elem, Elem::Bool | Elem::Known(DataType::U8)) {
            return Err(usage(format!(
                "in_rank: bool or uint8 arrays are needed, this one is {}",
                vin.elem.name()
            )));
        }
        self.inner.require("expert layout")?;
        let moe = self.moe.clone();
        let caller = self.inner.clone();
        py.detach(move || {
            let caller = &caller.caller;
            let out = LayoutOut {
                per_rank: &sr,
                per_expert: &se,
                in_rank: &sin,
                status: &ss,
            };
            // The communicator's launch order across streams, as its collectives keep; on the
            // host backend the call has finished when this returns (NumPy has no stream).
            // SAFETY: the arrays belong to live caller objects that the caller keeps alive
            // until the stream has passed the call (documented on every call of this module).
            caller.ordered(&*s, || unsafe { moe.layout(&si, tokens, &out, &*s) })?;
            caller.finish(&*s)
        })
        .py_err()
    }

    /// Sends each token (a row of `x`: `[tokens, ...]`, moved as bytes) to the ranks that hold
    /// its experts and receives theirs into `out_x` (rows of the same bytes; the rows `out_src`
    /// holds are the capacity), `out_idx` (`[capacity, topk]` int64: local experts, -1),
    /// `out_src` (`[capacity]` int32: each row's token at its source), `handle` (uint8,
    /// `handle_bytes`); optionally the weights (`topk_weights` `[tokens, topk]` float32 into
    /// `out_weights`) and scales (`scales` `[tokens, ...]` into `out_scales`). A collective
    /// call; the arrays must live until the stream has passed it.
    #[pyo3(signature = (x, topk_idx, out_x, out_idx, out_src, handle, *, topk_weights = None,
        out_weights = None, scales = None, out_scales = None, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        topk_idx: &Bound<'_, PyAny>,
        out_x: &Bound<'_, PyAny>,
        out_idx: &Bound<'_, PyAny>,
        out_src: &Bound<'_, PyAny>,
        handle: &Bound<'_, PyAny>,
        topk_weights: Option<&Bound<'_, PyAny>>,
        out_weights: Option<&Bound<'_, PyAny>>,
        scales: Option<&Bound<'_, PyAny>>,
        out_scales: Option<&Bound<'_, PyAny>>,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let (s, h) = self.inner.stream(x, stream)?;
        let (vi, si) = self.arr(topk_idx, "topk_idx", h)?;
        let tokens = self.tokens_of(&vi, "topk_idx")?;
        let (vx, sx) = self.arr(x, "x", h)?;
        let (vsrc, ssrc) = self.arr(out_src, "out_src", h)?;
        elem_is(&vsrc, "out_src", DataType::I32, "int32")?;
        let capacity = vsrc.len;
        let (vox, sox) = self.arr(out_x, "out_x", h)?;
        let (voi, soi) = self.arr(out_idx, "out_idx", h)?;
        elem_is(&voi, "out_idx", DataType::I64, "int64")?;
        let (_, sh) = self.arr(handle, "handle", h)?;
        let w = self.opt(topk_weights, "topk_weights", h)?;
        let ow = self.opt(out_weights, "out_weights", h)?;
        for (v, what) in [(&w, "topk_weights"), (&ow, "out_weights")] {
            if let Some((v, _)) = v {
                elem_is(v, what, DataType::F32, "float32")?;
            }
        }
        let sc = self.opt(scales, "scales", h)?;
        let osc = self.opt(out_scales, "out_scales", h)?;
        let per_token = |v: &ArrayView, rows: usize, what: &str| -> PyResult<usize> {
            if rows == 0 {
                return Ok(0);
            }
            if v.nbytes() % rows != 0 {
                return Err(usage(format!(
                    "{what}: {} bytes are not {rows} rows",
                    v.nbytes()
                )));
            }
            Ok(v.nbytes() / rows)
        };
        // A rank without tokens still takes part, with the widths of its outputs; with no
        // outputs either it receives nothing, and any width serves (1 byte).
        let row_bytes = match (tokens, capacity) {
            (0, 0) => 1,
            (0, _) => per_token(&vox, capacity, "out_x")?,
            _ => per_token(&vx, tokens, "x")?,
        };
        if tokens > 0 && capacity > 0 && vox.nbytes() != capacity * row_bytes {
            return Err(usage(format!(
                "out_x: {} bytes, but {capacity} rows (out_src) of {row_bytes} bytes (x's) are {}",
                vox.nbytes(),
                capacity * row_bytes
            )));
        }
        let scale_bytes = match (&sc, &osc, tokens) {
            (Some((v, _)), _, t) if t > 0 => per_token(v, tokens, "scales")?,
            (Some(_), Some((v, _)), 0) if capacity > 0 => per_token(v, capacity, "out_scales")?,
            (Some(_), _, _) => 1,
            (None, _, _) => 0,
        };
        self.inner.require("expert dispatch")?;
        let moe = self.moe.clone();
        let caller = self.inner.clone();
        py.detach(move || {
            let caller = &caller.caller;
            let d = Dispatch {
                tokens,
                x: &sx,
                row_bytes,
                topk_idx: &si,
                topk_weights: w.as_ref().map(|w| &w.1),
                scales: sc.as_ref().map(|s| (&s.1, scale_bytes)),
                capacity,
                out_x: &sox,
                out_idx: &soi,
                out_weights: ow.as_ref().map(|w| &w.1),
                out_scales: osc.as_ref().map(|s| &s.1),
                out_src: &ssrc,
                handle: &sh,
            };
            // Ordered and finished as in `layout`.
            // SAFETY: as in `layout`.
            caller.ordered(&*s, || unsafe { moe.dispatch(&d, &*s) })?;
            caller.finish(&*s)
        })
        .py_err()
    }

    /// Sends the received rows `x` (`[rows, hidden]` float32, float16 or bfloat16, in the
    /// dispatch's order) back and sums each of this rank's `tokens` rows into `out_x`
    /// (`[tokens, hidden]`, the same type); with `topk_weights` (`[rows, topk]` float32) the
    /// weights into `out_weights`. `handle` is the dispatch's; `hidden` the elements of a row.
    /// A collective call.
    #[pyo3(signature = (x, handle, out_x, *, hidden, topk_weights = None, out_weights = None,
        stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn combine(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        handle: &Bound<'_, PyAny>,
        out_x: &Bound<'_, PyAny>,
        hidden: usize,
        topk_weights: Option<&Bound<'_, PyAny>>,
        out_weights: Option<&Bound<'_, PyAny>>,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let (s, h) = self.inner.stream(x, stream)?;
        let (vx, sx) = self.arr(x, "x", h)?;
        let (vo, so) = self.arr(out_x, "out_x", h)?;
        let dtype = summed_type(&vx, &vo)?;
        let (_, sh) = self.arr(handle, "handle", h)?;
        let w = self.opt(topk_weights, "topk_weights", h)?;
        let ow = self.opt(out_weights, "out_weights", h)?;
        let k = self.k();
        for (v, what) in [(&w, "topk_weights"), (&ow, "out_weights")] {
            if let Some((v, _)) = v {
                elem_is(v, what, DataType::F32, "float32")?;
            }
        }
        let (rows, tokens) = (vx.len / hidden.max(1), vo.len / hidden.max(1));
        for (v, what, n) in [(&w, "topk_weights", rows), (&ow, "out_weights", tokens)] {
            if let Some((v, _)) = v {
                if v.len != n * k {
                    return Err(usage(format!(
                        "{what}: {} elements, but {n} rows of top-{k} are {}",
                        v.len,
                        n * k
                    )));
                }
            }
        }
        if hidden == 0 || vx.len != rows * hidden || vo.len != tokens * hidden {
            return Err(usage(format!(
                "combine: x of {} and out_x of {} elements are not {rows} and {tokens} rows of one hidden size",
                vx.len, vo.len
            )));
        }
        self.inner.require("expert combine")?;
        let moe = self.moe.clone();
        let caller = self.inner.clone();
        py.detach(move || {
            let caller = &caller.caller;
            let c = Combine {
                tokens,
                x: &sx,
                rows,
                dtype,
                hidden,
                topk_weights: w.as_ref().map(|w| &w.1),
                handle: &sh,
                out_x: &so,
                out_weights: ow.as_ref().map(|w| &w.1),
            };
            // Ordered and finished as in `layout`.
            // SAFETY: as in `layout`.
            caller.ordered(&*s, || unsafe { moe.combine(&c, &*s) })?;
            caller.finish(&*s)
        })
        .py_err()
    }

    /// The expert-major ("low-latency") dispatch: sends each token of `x` (`[tokens, ...]`, as
    /// bytes; `scales` `[tokens, blocks]` float32 optional) to the ranks of its experts, and
    /// lays what arrives out per local expert: `recv_x` (`[local, capacity, ...]`, `capacity`
    /// slots an expert), `src_info` (`[local, capacity]` int32: each slot's token at its source),
    /// `layout_range` (`[local, nranks]` int64: `begin << 32 | count` per source), `count`
    /// (`[local]` int32), `slots` (`slots_bytes`: kept for the combine), `handle`; optionally
    /// `recv_scales` (a contiguous float32 or int32 array holding element (expert, slot, block)
    /// at `scale_strides`, packed UE8M0 where `ue8m0`; `scale_bytes` a token where this rank has
    /// none) and `stats` (`[local]` int32 added to). With `cast_fp8`, `x` is bfloat16 and the
    /// send half casts it to E4M3 with a float32 scale per 128 channels (powers of two where
    /// `round_scale`): DeepEP's `use_fp8`.
    /// Each expert's slots hold its sources in rank order, each source's tokens in order.
    /// `half`: "both", "send" or "receive". A collective call; the arrays must live until the
    /// stream has passed it.
    #[pyo3(signature = (x, topk_idx, recv_x, src_info, layout_range, count, slots, handle, *,
        scales = None, recv_scales = None, scale_strides = None, ue8m0 = false, stats = None,
        scale_bytes = None, cast_fp8 = false, round_scale = false, half = None, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn dispatch_expert_major(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        topk_idx: &Bound<'_, PyAny>,
        recv_x: &Bound<'_, PyAny>,
        src_info: &Bound<'_, PyAny>,
        layout_range: &Bound<'_, PyAny>,
        count: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
        handle: &Bound<'_, PyAny>,
        scales: Option<&Bound<'_, PyAny>>,
        recv_scales: Option<&Bound<'_, PyAny>>,
        scale_strides: Option<(u64, u64, u64)>,
        ue8m0: bool,
        stats: Option<&Bound<'_, PyAny>>,
        scale_bytes: Option<usize>,
        cast_fp8: bool,
        round_scale: bool,
        half: Option<&str>,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let halves = halves_of(half)?;
        let (s, h) = self.inner.stream(x, stream)?;
        let (vi, si) = self.arr(topk_idx, "topk_idx", h)?;
        let tokens = self.tokens_of(&vi, "topk_idx")?;
        let (vx, sx) = self.arr(x, "x", h)?;
        // (Scales given with the cast are refused by the exchange, which makes them.)
        if cast_fp8 && vx.elem != Elem::Known(DataType::BF16) {
            return Err(usage(format!(
                "cast_fp8: x must be bfloat16 (it is {})",
                vx.elem.name()
            )));
        }
        if round_scale && !cast_fp8 {
            return Err(usage("round_scale rounds the scales of cast_fp8"));
        }
        let (vsrc, ssrc) = self.arr(src_info, "src_info", h)?;
        elem_is(&vsrc, "src_info", DataType::I32, "int32")?;
        let local = self.moe.local_experts();
        if vsrc.len == 0 || vsrc.len % local != 0 {
            return Err(usage(format!(
                "src_info: {} elements are not [local experts {local}, capacity]",
                vsrc.len
            )));
        }
        let capacity = vsrc.len / local;
        let (vrx, srx) = self.arr(recv_x, "recv_x", h)?;
        let (vr, sr) = self.arr(layout_range, "layout_range", h)?;
        elem_is(&vr, "layout_range", DataType::I64, "int64")?;
        let (vc, sc) = self.arr(count, "count", h)?;
        elem_is(&vc, "count", DataType::I32, "int32")?;
        let (_, ssl) = self.arr(slots, "slots", h)?;
        let (_, sh) = self.arr(handle, "handle", h)?;
        let st = self.opt(stats, "stats", h)?;
        if let Some((v, _)) = &st {
            elem_is(v, "stats", DataType::I32, "int32")?;
        }
        let sct = self.opt(scales, "scales", h)?;
        let rsc = self.opt(recv_scales, "recv_scales", h)?;
        // A row's bytes as sent: x's (with the cast, one per bf16 channel), or recv_x's where
        // this rank sends nothing.
        let row_bytes = vx
            .nbytes()
            .checked_div(tokens * if cast_fp8 { 2 } else { 1 })
            .unwrap_or(vrx.nbytes() / (local * capacity));
        if row_bytes == 0 || vrx.nbytes() != local * capacity * row_bytes {
            return Err(usage(format!(
                "recv_x: {} bytes, but [local {local}, capacity {capacity}] rows of {row_bytes} bytes are {}",
                vrx.nbytes(),
                local * capacity * row_bytes
            )));
        }
        // Every rank's rows must have one shape: a rank without tokens says its scales' width.
        let scale_bytes = match (&sct, tokens, scale_bytes) {
            _ if cast_fp8 => row_bytes / 128 * 4,
            (Some((v, _)), t, _) if t > 0 => v.nbytes() / t,
            (Some(_), _, Some(b)) => b,
            (Some(_), _, None) => {
                return Err(usage(
                    "scales of no tokens: scale_bytes (a token's scale bytes) is needed",
                ));
            }
            (None, _, _) => 0,
        };
        if rsc.is_some() && ((sct.is_none() && !cast_fp8) || scale_strides.is_none()) {
            return Err(usage(
                "recv_scales needs scales (or cast_fp8) and scale_strides (element strides of expert, slot, block)",
            ));
        }
        self.inner.require("expert dispatch")?;
        let moe = self.moe.clone();
        let caller = self.inner.clone();
        let empty = self.empty.slice(..0).py_err()?;
        py.detach(move || {
            let caller = &caller.caller;
            let d = Dispatch::expert_major(
                tokens,
                &sx,
                row_bytes,
                &si,
                sct.as_ref().map(|s| (&s.1, scale_bytes)),
                &sh,
                &empty,
            );
            let em = ExpertMajor {
                capacity,
                x: &srx,
                scales: rsc.as_ref().map(|r| ExpertScales {
                    buf: &r.1,
                    strides: scale_strides.map_or([0; 3], |(a, b, c)| [a, b, c]),
                    ue8m0,
                }),
                src: &ssrc,
                range: &sr,
                count: &sc,
                stats: st.as_ref().map(|s| &s.1),
                slots: &ssl,
                cast: cast_fp8.then_some(Fp8Cast { round_scale }),
            };
            // Ordered and finished as in `layout`.
            // SAFETY: as in `layout`.
            caller.ordered(&*s, || unsafe {
                moe.dispatch_with(&d, halves, Some(&em), &*s)
            })?;
            caller.finish(&*s)
        })
        .py_err()
    }

    /// The expert-major ("low-latency") combine: `x` (`[local, capacity, hidden]` float32,
    /// float16 or bfloat16: the experts' outputs at the dispatch's slots) goes back weighted by
    /// `topk_weights` (`[tokens, topk]` float32, this rank's), summed per token into `out_x`
    /// (`[tokens, hidden]`, the same type): at each rank the weighted sum of its experts' rows
    /// (f32, top-k order, rounded once), then over the ranks (f32, rank order, rounded once).
    /// `handle` and `slots` are the dispatch's. `half`: "both", "send" or "receive".
    #[pyo3(signature = (x, handle, slots, topk_weights, out_x, *, hidden, half = None,
        stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn combine_expert_major(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        handle: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
        topk_weights: &Bound<'_, PyAny>,
        out_x: &Bound<'_, PyAny>,
        hidden: usize,
        half: Option<&str>,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let halves = halves_of(half)?;
        let (s, h) = self.inner.stream(x, stream)?;
        let (vx, sx) = self.arr(x, "x", h)?;
        let (vo, so) = self.arr(out_x, "out_x", h)?;
        let dtype = summed_type(&vx, &vo)?;
        let (_, sh) = self.arr(handle, "handle", h)?;
        let (_, ssl) = self.arr(slots, "slots", h)?;
        let (vw, sw) = self.arr(topk_weights, "topk_weights", h)?;
        elem_is(&vw, "topk_weights", DataType::F32, "float32")?;
        let local = self.moe.local_experts();
        let (rows, tokens) = (vx.len / hidden.max(1), vo.len / hidden.max(1));
        if hidden == 0
            || vx.len != rows * hidden
            || vo.len != tokens * hidden
            || rows % local != 0
            || rows == 0
        {
            return Err(usage(format!(
                "combine: x of {} and out_x of {} elements are not [local experts {local}, capacity, {hidden}] and [tokens, {hidden}]",
                vx.len, vo.len
            )));
        }
        if vw.len != tokens * self.k() {
            return Err(usage(format!(
                "topk_weights: {} elements, but {tokens} tokens of top-{} are {}",
                vw.len,
                self.k(),
                tokens * self.k()
            )));
        }
        self.inner.require("expert combine")?;
        let moe = self.moe.clone();
        let caller = self.inner.clone();
        py.detach(move || {
            let caller = &caller.caller;
            let c = Combine {
                tokens,
                x: &sx,
                rows,
                dtype,
                hidden,
                topk_weights: None,
                handle: &sh,
                out_x: &so,
                out_weights: None,
            };
            let em = ExpertMajorIn {
                capacity: rows / local,
                slots: &ssl,
                topk_weights: &sw,
            };
            // Ordered and finished as in `layout`.
            // SAFETY: as in `layout`.
            caller.ordered(&*s, || unsafe {
                moe.combine_with(&c, halves, Some(&em), &*s)
            })?;
            caller.finish(&*s)
        })
        .py_err()
    }

    /// What a dispatch received, from its handle (waits for the stream): (rows from each source
    /// rank, rows for each local expert). Raises where the dispatch met an expert index out of
    /// range or received more rows than its outputs hold.
    #[pyo3(signature = (handle, *, stream = None))]
    fn received(
        &self,
        py: Python<'_>,
        handle: &Bound<'_, PyAny>,
        stream: Option<u64>,
    ) -> PyResult<(Vec<usize>, Vec<usize>)> {
        let (s, h) = self.inner.stream(handle, stream)?;
        let (_, sh) = self.arr(handle, "handle", h)?;
        let moe = self.moe.clone();
        let got = py.detach(move || moe.read_handle(&sh, &*s)).py_err()?;
        Ok((got.per_source, got.per_expert))
    }
}

/// `Communicator.expert_exchange`'s body (the method itself sits with the others).
pub(super) fn open(py: Python<'_>, inner: Arc<Inner>, cfg: MoeConfig) -> PyResult<ExpertExchange> {
    let comm = inner.comm().clone();
    let moe = py
        .detach(move || mscclpp_caller::expert_exchange(&comm, cfg))
        .py_err()?;
    let empty = inner.device().alloc(16, MemoryKind::Device).py_err()?;
    Ok(ExpertExchange {
        inner,
        moe: Arc::from(moe),
        empty,
    })
}
