"""DeepEP's Python API (V1 ``deep_ep.Buffer``, its "normal" mode) over this library's
expert-parallel exchange (``mscclpp_rs.Communicator.expert_exchange``), for torch tensors.

Opt-in, as ``import mscclpp`` is: ``MSCCLPP_RS_DEEP_EP=1`` (or ``mscclpp_rs.compat.install_deep_ep()``
before ``deep_ep`` is imported) makes ``import deep_ep`` give this module; otherwise
``import mscclpp_rs.deep_ep`` does.

Served: ``Buffer(group, num_nvl_bytes, num_rdma_bytes, low_latency_mode)`` (2 to 32 ranks, on
one host or several, DeepEP's internode shapes past 8: every byte given is the exchange's),
``get_dispatch_layout``, ``dispatch`` (bf16
rows, or FP8 rows with their per-128-channel scales; with or without top-k; a cached dispatch with
a handle; ``num_worst_tokens``; ``expert_alignment``), ``combine`` (bf16, f16 or f32 rows;
weights; one or two biases), ``low_latency_dispatch`` (bf16 or FP8, ``round_scale``, the receive
statistics, the hook) and ``low_latency_combine`` (weighted; ``zero_copy``, ``out``),
``EventOverlap``, ``Config`` and the size hints, ``capture``, ``get_comm_stream``,
``previous_event``, ``async_finish``, ``allocate_on_comm_stream``. Not served, with a clear
error: packed UE8M0 scales, ``get_local_buffer_tensor``; more than 32 ranks.

Semantics are DeepEP's (learnt from its public repository; none of its code is here): a token
goes once to each rank holding one of its experts (rank ``r`` holds experts
``[r E/n, (r + 1) E/n)``); received rows come by source rank, each source's in token order;
``recv_topk_idx`` holds local expert ids (-1 elsewhere) and ``recv_topk_weights`` 0 there; combine
sums, without weights, the rows of the ranks a token went to, in f32.
"""

from __future__ import annotations

import torch

import mscclpp_rs as _rs

IMPLEMENTATION = "mscclpp_rs"

topk_idx_t = torch.int64

# The exchange buffer's fixed bytes (collectives/src/moe/spec.md): the header.
_HEADER = 4096


def _round16(n: int) -> int:
    return (n + 15) // 16 * 16


def _row_bytes(hidden: int, topk: int) -> int:
    """A row of the exchange for bf16 hidden states, their FP8 scales and the top-k metadata."""
    return _round16(2 * hidden) + _round16((hidden + 127) // 128 * 4) + _round16(4 * (1 + 2 * topk))


class Config:
    """DeepEP's ``Config``: its chunk sizes are kept (and checked as DeepEP does) but do not
    change how this library moves data."""

    def __init__(self, num_sms: int = 20, num_max_nvl_chunked_send_tokens: int = 6,
                 num_max_nvl_chunked_recv_tokens: int = 256,
                 num_max_rdma_chunked_send_tokens: int = 6,
                 num_max_rdma_chunked_recv_tokens: int = 256):
        if num_max_nvl_chunked_send_tokens >= num_max_nvl_chunked_recv_tokens:
            raise ValueError("Config: NVL send chunk must be smaller than the NVL receive chunk")
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = num_max_rdma_chunked_recv_tokens

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int,
                                 num_max_tokens: int = 4096, num_topk: int = 32) -> int:
        """Bytes of a ``Buffer`` whose ranks dispatch up to ``num_max_tokens`` tokens of
        ``hidden_bytes`` (bf16) each: this library's exchange holds every token a call can
        receive, so its size follows the tokens, not DeepEP's chunks. A row's slots are the top-k
        or, for a dispatch without top-k (routed by its ranks), one per rank: the larger."""
        hidden = max(1, hidden_bytes // 2)
        slots = max(num_topk, num_ranks)
        return _HEADER + 2 * num_ranks * num_max_tokens * _row_bytes(hidden, slots)

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        return 0


class EventOverlap:
    """DeepEP's ``EventOverlap``: an event recorded on the stream a call ran on (None where the
    call finished before returning), and tensors kept alive until it is waited on."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors
        self._hook = None

    def register_hook_after_wait(self, fn):
        self._hook = fn

    def current_stream_wait(self, release_handle: bool = False) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)
        if self._hook is not None:
            self._hook()
        if release_handle:
            self.extra_tensors = None

    def __call__(self, release_handle: bool = False) -> "EventOverlap":
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.event is not None:
            self.current_stream_wait()
        return False


# DeepEP's NVLink peers per node: past this many ranks its calls take the internode shapes.
_NVL_PEERS = 8


class _Handle(tuple):
    """DeepEP's intranode handle (rank_prefix_matrix, channel_prefix_matrix,
    recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_head), or past 8 ranks its
    internode one (is_token_in_rank, rdma_channel_prefix_matrix, gbl_channel_prefix_matrix,
    recv_rdma_channel_prefix_matrix, recv_rdma_rank_prefix_sum, recv_gbl_channel_prefix_matrix,
    recv_gbl_rank_prefix_sum, recv_src_meta, send_rdma_head, send_nvl_head), carrying this
    library's own handle and routing for the combine and cached dispatches. One channel: the
    channel matrices hold one column."""

    def __new__(cls, items, state):
        h = super().__new__(cls, items)
        h._state = state
        return h


class _State:
    def __init__(self, ex, handle, tokens, topk_idx, topk, rows, capacity):
        self.ex, self.handle, self.tokens = ex, handle, tokens
        self.topk_idx, self.topk, self.rows, self.capacity = topk_idx, topk, rows, capacity


class Buffer:
    """DeepEP's ``Buffer`` for 2 to 32 ranks (one host or several), normal mode."""

    num_sms = 20

    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False, enable_shrink: bool = False, comm=None):
        if group is None:
            raise ValueError("mscclpp_rs.deep_ep.Buffer: pass a torch.distributed group")
        from mscclpp_rs.mscclpp import CommGroup

        import torch.distributed as dist

        self.group = group
        self.rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)
        self.num_nvl_bytes = int(num_nvl_bytes)
        self.num_rdma_bytes = int(num_rdma_bytes)
        self.low_latency_mode = bool(low_latency_mode)
        # Every byte given is the exchange's: within a host there is no separate RDMA buffer.
        self._budget = self.num_nvl_bytes + self.num_rdma_bytes
        self.explicitly_destroy = explicitly_destroy
        # DeepEP's layout past 8 ranks: "RDMA ranks" of 8 NVLink peers each (its internode
        # mode), whose counts and handle shape the calls then take and give. The exchange is the
        # same: peers on other hosts are reached through its relay.
        n = self.group_size
        if n > _NVL_PEERS and n % _NVL_PEERS:
            raise ValueError(f"mscclpp_rs.deep_ep.Buffer: {n} ranks; past {_NVL_PEERS} ranks "
                             f"DeepEP takes groups of {_NVL_PEERS} per node (a multiple of "
                             f"{_NVL_PEERS})")
        self._rdma_ranks = n // _NVL_PEERS if n > _NVL_PEERS else 1
        self._comm = CommGroup(torch_group=group).communicator
        self._exchanges = {}
        self._comm_stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        # Receive halves waiting for their hooks (_hook).
        self._pending = []

    # ---- DeepEP's static helpers -------------------------------------------------------------
    @staticmethod
    def is_sm90_compiled() -> bool:
        # DeepEP answers whether its FP8 paths were built; ours serves FP8 rows with their
        # per-128-channel scales on every backend.
        return True

    @classmethod
    def set_num_sms(cls, new_num_sms: int) -> None:
        if new_num_sms % 2:
            raise ValueError("Buffer.set_num_sms: the number of SMs must be even")
        cls.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        if not torch.cuda.is_available():
            return EventOverlap()
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream())
        return EventOverlap(ev)

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return Config(Buffer.num_sms, 6, 256, 6, 128)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return Config(Buffer.num_sms, 4, 256, 6, 128)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks,
                                       num_experts, num_topk: int = 32) -> int:
        """Bytes a low-latency ``Buffer`` needs for up to ``num_max_dispatch_tokens_per_rank``
        tokens: its two exchanges (bf16 rows out, the weighted combine's f32 sums back)."""
        per_token = _row_bytes(hidden, num_topk) + _row_bytes(2 * hidden, num_topk)
        return 2 * _HEADER + 2 * num_ranks * num_max_dispatch_tokens_per_rank * per_token

    def get_comm_stream(self):
        return self._comm_stream

    def get_local_buffer_tensor(self, *args, **kwargs):
        raise NotImplementedError(
            "mscclpp_rs.deep_ep: the exchange buffer is not exposed as a tensor")

    def destroy(self) -> None:
        if not self.explicitly_destroy:
            raise RuntimeError("Buffer.destroy: only with explicitly_destroy=True (as DeepEP)")
        self._exchanges.clear()
        if self._comm is not None:
            self._comm.close()
            self._comm = None

    # ---- streams and events ------------------------------------------------------------------
    def _stream(self, x, previous_event, async_finish, allocate_on_comm_stream):
        """The stream a call runs on: DeepEP's communication stream when asked, else the
        current one; it first waits for ``previous_event``."""
        if allocate_on_comm_stream and not (previous_event is not None and async_finish):
            raise ValueError(
                "allocate_on_comm_stream needs previous_event and async_finish (as DeepEP)")
        if not x.is_cuda:
            return None
        s = self._comm_stream if (async_finish or allocate_on_comm_stream) else torch.cuda.current_stream()
        if previous_event is not None and previous_event.event is not None:
            s.wait_event(previous_event.event)
        elif s is not torch.cuda.current_stream():
            s.wait_stream(torch.cuda.current_stream())
        return s

    def _finish(self, s, async_finish, tensors):
        if s is None:
            return EventOverlap()
        ev = torch.cuda.Event()
        ev.record(s)
        if s is not torch.cuda.current_stream():
            for t in tensors:
                if t is not None:
                    t.record_stream(s)
            if not async_finish:
                torch.cuda.current_stream().wait_event(ev)
        return EventOverlap(ev, tensors if async_finish else None)

    @staticmethod
    def _sid(s):
        return None if s is None else s.cuda_stream

    def _state_of(self, handle, what, low_latency=False):
        """The state behind ``handle``, or a clear error where it is not one of this Buffer's
        (another Buffer's handle would run the call over that Buffer's exchange) or not of the
        call's mode."""
        st = getattr(handle, "_state", None)
        mine, other = (("low_latency_dispatch", "dispatch") if low_latency
                       else ("dispatch", "low_latency_dispatch"))
        if not isinstance(st, _State) or all(st.ex is not e for e in self._exchanges.values()):
            raise ValueError(f"{what}: the handle was not returned by this Buffer's {mine}")
        if low_latency != hasattr(st, "layout"):
            raise ValueError(f"{what}: a handle of {other} (this call takes one of {mine})")
        return st

    # ---- the exchange ------------------------------------------------------------------------
    def _exchange(self, num_experts: int, topk: int, hidden: int, wide: bool = False,
                  normal: bool = False):
        """The exchange for these shapes (made once, collectively); ``wide``: rows of f32 (the
        low-latency combine's weighted sums), else of bf16. ``normal``: the normal mode's
        dispatch and combine, which share one exchange of at least ``max(topk, ranks)`` routing
        columns (a dispatch without top-k routes by rank: one column per rank), its route padded
        with -1 (``_pad``): each exchange holds the whole budget, so one per top-k would hold
        it twice (DeepEP's test dispatches with and without top-k through one Buffer)."""
        n = self.group_size
        if normal:
            for k, ex in self._exchanges.items():
                if k[:3] == ("normal", num_experts, hidden) and ex.topk >= topk:
                    return ex
            # (A later call of a larger top-k than the first's gets an exchange of its own.)
            topk = max(topk, n)
            key, ex = ("normal", num_experts, hidden, topk), None
        else:
            key = (num_experts, topk, hidden, wide)
            ex = self._exchanges.get(key)
        if ex is None:
            row = (4 if wide else 2) * hidden
            per_row = _row_bytes(row // 2, topk)
            # A low-latency Buffer holds two exchanges (bf16 rows out, f32 sums back): the
            # budget is shared between them in proportion to their rows.
            budget = self._budget
            if self.low_latency_mode:
                both = _row_bytes(hidden, topk) + _row_bytes(2 * hidden, topk)
                budget = budget * per_row // both
            max_tokens = (budget - _HEADER) // (2 * n * per_row)
            if max_tokens < 1:
                raise ValueError(
                    f"Buffer: {self._budget} bytes hold no token of hidden size {hidden} at "
                    f"top-{topk} over {n} ranks; Config().get_nvl_buffer_size_hint({row}, {n}, "
                    f"num_max_tokens) says what a batch needs")
            ex = self._comm.expert_exchange(num_experts, topk, max_tokens, row,
                                            (hidden + 127) // 128 * 4)
            self._exchanges[key] = ex
        return ex

    @staticmethod
    def _pad(t, columns, fill):
        """``t`` ([tokens, k]) widened to ``columns`` with ``fill`` (the normal mode's exchange
        may route more columns than a call has)."""
        if t is None or t.shape[1] == columns:
            return t
        pad = torch.full((t.shape[0], columns - t.shape[1]), fill, dtype=t.dtype,
                         device=t.device)
        return torch.cat([t, pad], 1).contiguous()

    def _send(self, ex, xs, scales, route, weights, cap, s):
        """One dispatch through ``ex`` into outputs of ``cap`` rows (experts -1 and weights 0
        past what arrives): (out_x, out_idx, out_w, out_src, out_scales, handle bytes)."""
        dev, topk = xs.device, route.shape[1]
        out_x = torch.empty((cap,) + tuple(xs.shape[1:]), dtype=xs.dtype, device=dev)
        out_idx = torch.full((cap, topk), -1, dtype=torch.int64, device=dev)
        out_w = torch.zeros((cap, topk), dtype=torch.float32, device=dev)
        out_src = torch.empty(cap, dtype=torch.int32, device=dev)
        out_sc = None
        if scales is not None:
            out_sc = torch.empty((cap, scales.shape[1]), dtype=scales.dtype, device=dev)
        hb = torch.empty(ex.handle_bytes, dtype=torch.uint8, device=dev)
        # Rows move as bytes (FP8 included, whatever DLPack calls it).
        ex.dispatch(xs.view(torch.uint8), route, out_x.view(torch.uint8), out_idx, out_src, hb,
                    topk_weights=weights, out_weights=out_w if weights is not None else None,
                    scales=scales, out_scales=out_sc, stream=self._sid(s))
        return out_x, out_idx, out_w, out_src, out_sc, hb

    def _to_node(self, in_rank):
        """[tokens, nodes]: whether each token goes to some rank of each node of 8 (DeepEP's
        RDMA ranks)."""
        return in_rank.view(-1, self._rdma_ranks, _NVL_PEERS).any(2)

    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None,
                            async_finish=False, allocate_on_comm_stream=False):
        """(num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert,
        is_token_in_rank, event); num_tokens_per_rdma_rank (tokens bound for each node of 8
        ranks) is None within 8 ranks, as DeepEP's."""
        n = self.group_size
        if num_experts % n:
            raise ValueError(f"get_dispatch_layout: {num_experts} experts over {n} ranks")
        if topk_idx.dim() != 2:
            raise ValueError("get_dispatch_layout: topk_idx must be [num_tokens, num_topk]")
        s = self._stream(topk_idx, previous_event, async_finish, allocate_on_comm_stream)
        with torch.cuda.stream(s) if s is not None else _nullcontext():
            idx = topk_idx.to(torch.int64)
            # Indices outside 0..E are not counted (no host sync to refuse them here: the
            # dispatch drops them and its handle says so).
            valid = (idx >= 0) & (idx < num_experts)
            owner = torch.where(valid, idx // (num_experts // n), torch.zeros_like(idx))
            in_rank = torch.zeros((idx.shape[0], n), dtype=torch.bool, device=idx.device)
            in_rank.scatter_(1, owner, valid)
            # A token with two experts on one rank: scatter_ keeps whichever wrote last, so
            # count the ranks again from the experts themselves.
            hit = torch.zeros((idx.shape[0], n), dtype=torch.int32, device=idx.device)
            hit.scatter_add_(1, owner, valid.to(torch.int32))
            in_rank = hit > 0
            per_rank = in_rank.sum(0, dtype=torch.int32)
            per_expert = torch.bincount(idx[valid], minlength=num_experts).to(torch.int32)
            per_node = None
            if self._rdma_ranks > 1:
                per_node = self._to_node(in_rank).sum(0, dtype=torch.int32)
        ev = self._finish(s, async_finish, [per_rank, per_expert, in_rank])
        return per_rank, per_node, per_expert, in_rank, ev

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                 topk_weights=None, expert_alignment: int = 1, num_worst_tokens: int = 0,
                 config=None, previous_event=None, async_finish=False,
                 allocate_on_comm_stream=False):
        self._flush_receives()
        fp8 = isinstance(x, tuple)
        n = self.group_size
        if (topk_idx is None) != (topk_weights is None):
            raise ValueError("dispatch: topk_idx and topk_weights go together")
        if handle is not None:
            if topk_idx is not None:
                raise ValueError("dispatch with a handle (cached) takes no topk_idx")
            st = self._state_of(handle, "dispatch (cached)")
            with_topk, experts = False, st.ex.num_experts
        else:
            if num_tokens_per_expert is None or is_token_in_rank is None:
                raise ValueError(
                    "dispatch: num_tokens_per_expert and is_token_in_rank (get_dispatch_layout's) "
                    "are needed without a handle")
            experts = num_tokens_per_expert.numel()
            with_topk = topk_idx is not None
        # Everything the call derives from its inputs runs on its stream, after the stream's
        # wait: with previous_event the call's stream waits for that event only, so work queued
        # on the current stream since then (a route, a contiguous copy) would race the kernel.
        s = self._stream(x[0] if fp8 else x, previous_event, async_finish,
                         allocate_on_comm_stream)
        with torch.cuda.stream(s) if s is not None else _nullcontext():
            xs, scales = (x[0], x[1].contiguous()) if fp8 else (x, None)
            xs = xs.contiguous()
            dev = xs.device
            if handle is not None:
                route = st.topk_idx
            elif with_topk:
                route = topk_idx.to(torch.int64).contiguous()
            else:
                # No top-k: route by the ranks alone, one slot per rank (its first expert).
                local = experts // n
                first = torch.arange(n, device=dev, dtype=torch.int64) * local
                route = torch.where(is_token_in_rank.bool(), first, torch.full_like(first, -1))
                route = route.contiguous()
            tokens, hidden = xs.shape[0], xs.shape[1]
            topk = topk_idx.shape[1] if with_topk else n
            # A cached dispatch runs through its handle's exchange (its positions are that one's).
            ex = (st.ex if handle is not None
                  else self._exchange(experts, route.shape[1], hidden, normal=True))
            route = self._pad(route, ex.topk, -1)
            cap = num_worst_tokens if num_worst_tokens else n * ex.max_tokens
            w = topk_weights.to(torch.float32).contiguous() if with_topk else None
            w = self._pad(w, ex.topk, 0.0)
            out_x, out_idx, out_w, out_src, out_sc, hb = self._send(ex, xs, scales, route, w,
                                                                    cap, s)
            counts = hb[: 4 * n].view(torch.int32)
            # This rank's prefix over sources; within 8 ranks DeepEP's handle holds every
            # rank's (column j: what rank j received from 0..i), past 8 only this rank's (the
            # same on every rank of the group, so all of them skip the gather alike).
            mine = torch.cumsum(counts, 0, dtype=torch.int32)
            rank_prefix = None
            if self._rdma_ranks == 1:
                gathered = torch.empty(n * n, dtype=torch.int32, device=dev)
                self._comm.all_gather(gathered, mine, stream=self._sid(s))
                rank_prefix = gathered.view(n, n).t().contiguous()
            positions = hb[ex.handle_positions_at:].view(torch.int32)[: tokens * n]
            send_head = positions.view(tokens, n)
            every_expert = None
            if handle is None and not with_topk and not num_worst_tokens:
                # Without top-k the rows carry no experts: as DeepEP, the received count of each
                # local expert is what every rank's layout counted for it.
                every_expert = torch.empty(n * experts, dtype=torch.int32, device=dev)
                self._comm.all_gather(every_expert,
                                      num_tokens_per_expert.to(torch.int32).contiguous(),
                                      stream=self._sid(s))
            if num_worst_tokens:
                rows, per_expert_list = cap, []
            else:
                per_source, per_expert = ex.received(hb, stream=self._sid(s))
                if every_expert is not None:
                    local = experts // n
                    per_expert = every_expert.view(n, experts).sum(0)[
                        self.rank * local:(self.rank + 1) * local].tolist()
                rows = sum(per_source)
                a = max(1, expert_alignment)
                per_expert_list = [(c + a - 1) // a * a for c in per_expert]
            recv_x = out_x[:rows]
            recv_x = (recv_x, out_sc[:rows]) if fp8 else recv_x
            state = _State(ex, hb, tokens, route, topk, rows, cap)
            internode = self._rdma_ranks > 1
            if is_token_in_rank is not None:
                in_rank = is_token_in_rank
            else:
                in_rank = handle[0] if internode else handle[4]
            # One channel: what this rank sends to each rank, and receives from each (read from
            # the handle bytes on the call's stream: with num_worst_tokens nothing waited for
            # the kernel on the host).
            channel_prefix = in_rank.sum(0, dtype=torch.int32).view(n, 1)
            recv_channel_prefix = counts.view(n, 1).clone()
            if internode:
                nodes = self._rdma_ranks
                to_node = self._to_node(in_rank)
                from_node = counts.view(nodes, _NVL_PEERS).sum(1, dtype=torch.int32)
                # send_rdma_head: each token's row among those this rank sends to each node (-1:
                # none), as send_head is per rank.
                rdma_head = torch.where(to_node,
                                        torch.cumsum(to_node.int(), 0, dtype=torch.int32) - 1,
                                        torch.full_like(to_node, -1, dtype=torch.int32))
                new_handle = _Handle((in_rank, to_node.sum(0, dtype=torch.int32).view(nodes, 1),
                                      channel_prefix, from_node.view(nodes, 1).clone(),
                                      torch.cumsum(from_node, 0, dtype=torch.int32),
                                      recv_channel_prefix, mine, out_src[:rows], rdma_head,
                                      send_head), state)
            else:
                new_handle = _Handle((rank_prefix, channel_prefix, recv_channel_prefix,
                                      out_src[:rows], in_rank, send_head), state)
        ev = self._finish(s, async_finish, [out_x, out_idx, out_w, out_src, out_sc, hb, xs, scales,
                                            route, w])
        if handle is not None:
            return recv_x, None, None, None, None, ev
        if not with_topk:
            return recv_x, None, None, per_expert_list, new_handle, ev
        return recv_x, out_idx[:rows, :topk], out_w[:rows, :topk], per_expert_list, new_handle, ev

    def combine(self, x, handle, topk_weights=None, bias=None, config=None,
                previous_event=None, async_finish=False, allocate_on_comm_stream=False):
        st = self._state_of(handle, "combine")
        self._flush_receives()
        hidden = x.shape[1]
        biases = () if bias is None else (bias if isinstance(bias, tuple) else (bias,))
        s = self._stream(x, previous_event, async_finish, allocate_on_comm_stream)
        with torch.cuda.stream(s) if s is not None else _nullcontext():
            rows_in = x.contiguous()
            out = torch.empty((st.tokens, hidden), dtype=x.dtype, device=x.device)
            w = out_w = None
            if topk_weights is not None:
                w = self._pad(topk_weights.to(torch.float32).contiguous(), st.ex.topk, 0.0)
                out_w = torch.empty((st.tokens, st.ex.topk), dtype=torch.float32,
                                    device=x.device)
            st.ex.combine(rows_in, st.handle, out, hidden=hidden, topk_weights=w,
                          out_weights=out_w, stream=self._sid(s))
            if biases:
                # DeepEP adds the biases to the f32 sum before rounding; here the sum is rounded
                # once before (at most one unit in the last place apart).
                acc = out.float()
                for b in biases:
                    acc = acc + b.float()
                out = acc.to(x.dtype)
        ev = self._finish(s, async_finish, [out, out_w, rows_in, w, st.handle])
        return out, (None if out_w is None else out_w[:, :st.topk]), ev

    # ---- the low-latency calls ----------------------------------------------------------------
    # Composed from the exchange: the tokens go to the ranks of their experts as in `dispatch`
    # (FP8-cast first where asked, with no host sync), then each rank lays what arrived out per
    # local expert ([local experts, ranks x max tokens, hidden]); the combine weighs each expert's
    # output by the token's weight where it was computed (the weights reach it by a dispatch of
    # their own) and sums over the ranks in f32.

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        """Nothing to clean: the exchange's sequences are never reset."""

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats=None,
                             dispatch_wait_recv_cost_stats=None, use_fp8=True, round_scale=False,
                             use_ue8m0=False, async_finish=False, return_recv_hook=False):
        """(recv_x, recv_count, handle, event, hook), as DeepEP's."""
        self._flush_receives()
        if async_finish and return_recv_hook:
            raise ValueError("low_latency_dispatch: async_finish and return_recv_hook exclude "
                             "each other (as DeepEP)")
        if use_ue8m0 and not round_scale:
            raise ValueError("low_latency_dispatch: use_ue8m0 needs round_scale (as DeepEP)")
        n, big_n = self.group_size, int(num_max_dispatch_tokens_per_rank)
        tokens, hidden = x.shape
        if use_ue8m0 and (not use_fp8 or hidden % 512):
            raise ValueError(f"low_latency_dispatch: use_ue8m0 packs four 128-channel scales per "
                             f"int32: it needs use_fp8 and a hidden size that is a multiple of "
                             f"512 (got {hidden})")
        if tokens > big_n:
            raise ValueError(f"low_latency_dispatch: {tokens} tokens, at most "
                             f"num_max_dispatch_tokens_per_rank={big_n}")
        if hidden % 128 or num_experts % n:
            raise ValueError(f"low_latency_dispatch: hidden {hidden} (a multiple of 128) and "
                             f"{num_experts} experts over {n} ranks")
        local = num_experts // n
        route = topk_idx.to(torch.int64).contiguous()
        ex = self._exchange(num_experts, route.shape[1], hidden)
        s = self._stream(x, None, async_finish, False)
        if ex.expert_major:
            return self._ll_dispatch(ex, x, route, big_n, num_experts, use_fp8, round_scale,
                                     use_ue8m0, cumulative_local_expert_recv_stats,
                                     async_finish, return_recv_hook, s)
        # Ranks on several hosts: composed from the flat exchange and torch operations.
        with torch.cuda.stream(s) if s is not None else _nullcontext():
            xs, scales = (_cast_fp8(x.contiguous(), round_scale) if use_fp8
                          else (x.contiguous(), None))
            cap = n * big_n
            out_x, out_idx, _, out_src, out_sc, hb = self._send(ex, xs, scales, route, None, cap, s)
            lay = _ExpertLayout(out_idx, hb, n, local, cap)
            # Placed as bytes (index_put serves no float8 type).
            row_bytes = out_x.view(torch.uint8).view(cap, -1)
            recv_x = lay.place(row_bytes, 0, row_bytes.shape[1:])
            recv_x = recv_x.view(xs.dtype).view(local, cap, hidden)
            if use_fp8:
                # Column-major within each expert, as DeepEP returns them.
                sc = torch.zeros((local + 1, scales.shape[1], cap), dtype=torch.float32,
                                 device=x.device).transpose(1, 2)
                sc[lay.expert, lay.slot] = out_sc[lay.row]
                sc = sc[:local]
                if use_ue8m0:
                    sc = _pack_ue8m0(sc)
                recv_x = (recv_x, sc)
            src_info = lay.place(out_src, -1, ())
            if cumulative_local_expert_recv_stats is not None:
                cumulative_local_expert_recv_stats += lay.count.to(
                    cumulative_local_expert_recv_stats.dtype)
        state = _State(ex, hb, tokens, route, route.shape[1], cap, cap)
        state.layout, state.hidden, state.experts = lay, hidden, num_experts
        state.zero_copy = None
        handle = _Handle((src_info, lay.ranges, big_n, hidden, num_experts), state)
        ev = self._finish(s, async_finish, [out_x, out_idx, out_src, out_sc, hb, x, xs, scales,
                                            route])
        return recv_x, lay.count, handle, ev, (lambda: None) if return_recv_hook else None

    def _ll_dispatch(self, ex, x, route, big_n, num_experts, use_fp8, round_scale, use_ue8m0,
                     stats, async_finish, return_recv_hook, s):
        """The low-latency dispatch as the exchange's expert-major form: one kernel casts (FP8)
        and sends, and lays out per local expert what arrives (with the hook: a send launch now,
        the receive launch when the hook is called)."""
        n = self.group_size
        tokens, hidden = x.shape
        local, cap, dev = num_experts // n, n * big_n, x.device
        with torch.cuda.stream(s) if s is not None else _nullcontext():
            # With FP8 the send half casts the bf16 rows itself (a scale per 128 channels).
            xs = x.to(torch.bfloat16).contiguous()
            recv_x = torch.empty((local, cap, hidden),
                                 dtype=torch.float8_e4m3fn if use_fp8 else xs.dtype, device=dev)
            src_info = torch.empty((local, cap), dtype=torch.int32, device=dev)
            ranges = torch.empty((local, n), dtype=torch.int64, device=dev)
            count = torch.empty(local, dtype=torch.int32, device=dev)
            slots = torch.empty(ex.slots_bytes, dtype=torch.uint8, device=dev)
            hb = torch.empty(ex.handle_bytes, dtype=torch.uint8, device=dev)
            kw = {}
            sc = None
            if use_fp8:
                # Column-major within each expert, as DeepEP returns them: stored
                # [local, blocks, cap], handed out transposed.
                blocks = hidden // 512 if use_ue8m0 else hidden // 128
                store = torch.zeros((local, blocks, cap),
                                    dtype=torch.int32 if use_ue8m0 else torch.float32, device=dev)
                sc = store.transpose(1, 2)
                kw = dict(recv_scales=store, scale_strides=(blocks * cap, 1, cap),
                          ue8m0=use_ue8m0, cast_fp8=True, round_scale=round_scale)
            direct = (stats is not None and stats.dtype == torch.int32 and stats.is_contiguous()
                      and stats.device == dev and stats.numel() == local)
            if direct:
                kw["stats"] = stats
            args = (xs if use_fp8 else xs.view(torch.uint8), route, recv_x.view(torch.uint8),
                    src_info, ranges, count, slots, hb)

            def receive():
                ex.dispatch_expert_major(*args, half="receive", stream=self._sid(s), **kw)
                if stats is not None and not direct:
                    stats.add_(count.to(stats.dtype))

            if return_recv_hook:
                ex.dispatch_expert_major(*args, half="send", stream=self._sid(s), **kw)
            else:
                ex.dispatch_expert_major(*args, stream=self._sid(s), **kw)
                if stats is not None and not direct:
                    stats.add_(count.to(stats.dtype))
        state = _State(ex, hb, tokens, route, route.shape[1], cap, cap)
        state.layout, state.slots, state.hidden, state.experts = None, slots, hidden, num_experts
        state.zero_copy = None
        handle = _Handle((src_info, ranges, big_n, hidden, num_experts), state)
        keep = [recv_x, src_info, ranges, count, slots, hb, x, xs, route, sc]
        ev = self._finish(s, async_finish, keep)
        hook = self._hook(s, receive) if return_recv_hook else None
        return (recv_x, sc) if use_fp8 else recv_x, count, handle, ev, hook

    def _hook(self, s, receive):
        """DeepEP's receive hook: launches the call's receive half on the stream the call was
        made on (as DeepEP's launches on its compute stream), once. Until then it waits in
        ``_pending``: a later call launches it first (the exchange keeps one call of each kind
        in flight, and a dispatch may not rewrite rows a combine still reads), after which the
        hook does nothing."""
        done = []

        def hook():
            if done:
                return
            done.append(True)
            self._pending.remove(hook)
            with torch.cuda.stream(s) if s is not None else _nullcontext():
                receive()

        self._pending.append(hook)
        return hook

    def _flush_receives(self):
        """Launches every receive half still waiting for its hook, in order."""
        for hook in list(self._pending):
            hook()

    def _ll_combine(self, st, x, topk_weights, topk_idx, async_finish, return_recv_hook, out):
        """The low-latency combine as the exchange's expert-major form: each rank sends back,
        per token it received, the sum of its experts' outputs weighted by the token's weights
        (which the source writes into the rows it dispatched), and the source sums those."""
        n = self.group_size
        local = st.experts // n
        if tuple(x.shape) != (local, st.rows, st.hidden):
            raise ValueError(f"low_latency_combine: x of shape {tuple(x.shape)}; the dispatch "
                             f"gave [{local}, {st.rows}, {st.hidden}]")
        s = self._stream(x, None, async_finish, False)
        with torch.cuda.stream(s) if s is not None else _nullcontext():
            xc = x.contiguous()
            # Entries the combine's routing masks (-1) are left out, as DeepEP's are.
            w = torch.where(topk_idx.to(topk_weights.device) >= 0,
                            topk_weights.to(torch.float32), 0.0).contiguous()
            direct = (out is not None and out.dtype == xc.dtype and out.is_contiguous()
                      and tuple(out.shape) == (st.tokens, st.hidden))
            result = out if direct else torch.empty((st.tokens, st.hidden), dtype=xc.dtype,
                                                    device=x.device)
            args = (xc, st.handle, st.slots, w, result)

            def receive():
                st.ex.combine_expert_major(*args, hidden=st.hidden, half="receive",
                                           stream=self._sid(s))
                if out is not None and not direct:
                    out.copy_(result)

            if return_recv_hook:
                st.ex.combine_expert_major(*args, hidden=st.hidden, half="send",
                                           stream=self._sid(s))
            else:
                st.ex.combine_expert_major(*args, hidden=st.hidden, stream=self._sid(s))
                if out is not None and not direct:
                    out.copy_(result)
        ev = self._finish(s, async_finish, [result, xc, w, st.handle, st.slots])
        hook = self._hook(s, receive) if return_recv_hook else None
        return (out if out is not None else result), ev, hook

    def get_next_low_latency_combine_buffer(self, handle):
        """A [local experts, ranks x max tokens, hidden] bf16 tensor that a ``zero_copy``
        combine of ``handle`` reads."""
        st = self._state_of(handle, "get_next_low_latency_combine_buffer", low_latency=True)
        if st.zero_copy is None:
            local = st.experts // self.group_size
            st.zero_copy = torch.empty((local, st.rows, st.hidden), dtype=torch.bfloat16,
                                       device=st.handle.device)
        return st.zero_copy

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False,
                            zero_copy=False, async_finish=False, return_recv_hook=False, out=None,
                            combine_wait_recv_cost_stats=None):
        """(combined_x, event, hook): each token's expert outputs weighted by its top-k weights
        and summed, as DeepEP's."""
        self._flush_receives()
        if async_finish and return_recv_hook:
            raise ValueError("low_latency_combine: async_finish and return_recv_hook exclude "
                             "each other (as DeepEP)")
        st = self._state_of(handle, "low_latency_combine", low_latency=True)
        if zero_copy:
            x = self.get_next_low_latency_combine_buffer(handle)
        if getattr(st, "slots", None) is not None:
            return self._ll_combine(st, x, topk_weights, topk_idx, async_finish,
                                    return_recv_hook, out)
        n, lay = self.group_size, st.layout
        s = self._stream(x, None, async_finish, False)
        with torch.cuda.stream(s) if s is not None else _nullcontext():
            # The weights to where the experts ran, in the order the rows arrived there.
            w = topk_weights.to(torch.float32).contiguous()
            _, _, rw, _, _, _ = self._send(st.ex, w, None, st.topk_idx, w, st.rows, s)
            z = torch.zeros((st.rows, st.hidden), dtype=torch.float32, device=x.device)
            # In chunks of `rows` entries (a captured layout holds every top-k entry).
            local = lay.count.shape[0]
            step = max(st.rows, 1)  # no rows: nothing to add, and range() refuses a step of 0
            for c in range(0, lay.pair.numel(), step):
                part = slice(c, c + step)
                e = lay.expert[part].clamp(max=local - 1)
                vals = x[e, lay.slot[part]].float() * rw.flatten()[lay.pair[part]].unsqueeze(1)
                z.index_add_(0, lay.row[part],
                             torch.where(lay.valid[part].unsqueeze(1), vals, 0.0))
            wide = self._exchange(st.experts, st.topk, st.hidden, wide=True)
            # The rows' order at each rank is the dispatch's: its handle serves the combine.
            summed = torch.empty((st.tokens, st.hidden), dtype=torch.float32, device=x.device)
            wide_hb = self._rebase(st, wide, s)
            wide.combine(z, wide_hb, summed, hidden=st.hidden, stream=self._sid(s))
            result = summed.to(torch.bfloat16)
            if out is not None:
                out.copy_(result)
                result = out
        ev = self._finish(s, async_finish, [result, z, x, w, summed, st.handle])
        return result, ev, (lambda: None) if return_recv_hook else None

    def _rebase(self, st, wide, s):
        """The dispatch's handle for the wide exchange: a dispatch of nothing but the routing
        through it gives the same counts and positions (the rows' order is the routing's)."""
        if getattr(st, "wide_handle", None) is None:
            word = torch.empty((st.tokens, 4), dtype=torch.uint8, device=st.handle.device)
            _, _, _, _, _, hb = self._send(wide, word, None, st.topk_idx, None, st.rows, s)
            st.wide_handle = hb
        return st.wide_handle


def _cast_fp8(x, round_scale):
    """Per token and 128 channels: scales = amax / 448 (a power of two with ``round_scale``),
    rows divided by their scale and cast to float8 e4m3."""
    t, h = x.shape
    blocks = x.float().view(t, h // 128, 128)
    amax = blocks.abs().amax(dim=2).clamp(min=1e-4)
    scales = amax / 448.0
    if round_scale:
        scales = torch.pow(2.0, torch.ceil(torch.log2(scales)))
    x8 = (blocks / scales.unsqueeze(2)).view(t, h).to(torch.float8_e4m3fn)
    return x8, scales.contiguous()


def _pack_ue8m0(sc):
    """Power-of-two f32 scales [..., rows, blocks] as DeepEP's packed UE8M0: each scale's
    biased exponent in a byte, four blocks per int32 (the first in the low byte), [..., rows,
    blocks / 4], column-major within the leading index as the f32 scales are. A zero scale (a
    slot nothing arrived in) packs as 0."""
    exp = ((sc.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    packed = exp.view(torch.int32)
    return packed.transpose(-1, -2).contiguous().transpose(-1, -2)


class _ExpertLayout:
    """Where each (received row, top-k entry) with a local expert goes in the per-expert layout:
    slots in row order within each expert, and DeepEP's ``layout_range`` (per expert and source
    rank: ``begin << 32 | count``).

    Eagerly the entries are those with a local expert (``torch.nonzero``, which waits for the
    device). Under CUDA graph capture, which cannot wait, they are every (row, top-k) entry of
    the fixed-size outputs, ``valid`` saying which hold a local expert: the others go to a spare
    expert ``local`` (slot 0) that the tensors handed out leave off. Decode engines capture the
    low-latency calls in graphs, so nothing here may read a count on the host."""

    # Tests set it to run the captured form eagerly (on the host backend too).
    every_entry = False

    def __init__(self, out_idx, hb, n, local, cap):
        k = out_idx.shape[1]
        dev = out_idx.device
        flat = out_idx.flatten()
        valid = (flat >= 0) & (flat < local)
        expert_all = torch.where(valid, flat, local)
        # One-hot by comparison (F.one_hot checks its range on the host).
        onehot = (expert_all.unsqueeze(1) == torch.arange(local + 1, device=dev)).to(torch.int64)
        slot_all = torch.where(valid, ((onehot.cumsum(0) - onehot) * onehot).sum(1), 0)
        if _ExpertLayout.every_entry or (dev.type == "cuda"
                                         and torch.cuda.is_current_stream_capturing()):
            self.pair = torch.arange(flat.numel(), device=dev)
        else:
            self.pair = torch.nonzero(valid).flatten()
        self.valid = valid[self.pair]
        self.row = self.pair // k
        self.expert = expert_all[self.pair]
        self.slot = slot_all[self.pair]
        self.count = onehot[:, :local].sum(0).to(torch.int32)
        # The source rank of each row, from the per-source counts in the handle.
        ends = torch.cumsum(hb[: 4 * n].view(torch.int32).to(torch.int64), 0)
        src_rank = torch.bucketize(self.row, ends, right=True).clamp(max=n - 1)
        per = torch.zeros((local + 1, n), dtype=torch.int64, device=dev)
        per.index_put_((self.expert, src_rank), self.valid.to(torch.int64), accumulate=True)
        per = per[:local]
        begin = torch.cumsum(per, 1) - per
        self.ranges = (begin << 32) | per

    def place(self, values, fill, shape_tail):
        """``values`` (one per received row) at each entry's (expert, slot): a tensor of
        [local, cap] + ``shape_tail``, ``fill`` where nothing arrived."""
        local = self.count.shape[0]
        cap = values.shape[0]
        out = torch.full((local + 1, cap) + tuple(shape_tail), fill, dtype=values.dtype,
                         device=values.device)
        out[self.expert, self.slot] = values[self.row]
        return out[:local]

class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


__all__ = ["Buffer", "Config", "EventOverlap", "topk_idx_t", "IMPLEMENTATION"]
