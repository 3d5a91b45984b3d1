"""A ``torch.distributed`` backend named ``mscclpp``, written in Python over ``mscclpp_rs``.

Importing this module registers it::

    import mscclpp_rs.torch_backend  # noqa: F401  (registers "mscclpp")
    torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group("cuda:mscclpp")        # or "cpu:gloo,cuda:mscclpp"

No C++ build and no ``LD_PRELOAD``: PyTorch lets a Python subclass of
``torch.distributed.ProcessGroup`` serve as a backend (its ``PyProcessGroup`` trampoline routes
the collectives of ``torch.distributed`` to the subclass's methods). The ranks bootstrap through
PyTorch's store: rank 0 makes a ``UniqueId`` and publishes it there.

Every operation is enqueued on the caller's current stream, as ``mscclpp_rs`` does. Its
``Work`` holds a CUDA-aware future that recorded an event on that stream when the operation was
enqueued: ``wait()`` (or ``get_future().wait()``) makes the stream current *at the wait* wait for
that event, as NCCL's ``Work.wait()`` makes it wait for NCCL's stream. A collective issued on a
side stream with ``async_op=True`` and waited for on the default stream is therefore ordered,
with no event of the caller's. On the host backend the operation is complete when returned.
"""

from __future__ import annotations

import functools
import os
from typing import Any, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch.futures import Future

import mscclpp_rs

try:  # the completed-future Work; present since PyTorch 2.1
    from torch._C._distributed_c10d import _create_work_from_future
except ImportError:  # pragma: no cover - old PyTorch
    _create_work_from_future = None

#: The backend's name, as ``init_process_group`` takes it.
NAME = "mscclpp"
#: The store key under which rank 0 publishes the bootstrap id (the store is the group's own,
#: prefixed per group by PyTorch).
UID_KEY = "mscclpp_rs/unique_id"

_OPS = (
    ("SUM", "sum"),
    ("PRODUCT", "prod"),
    ("MIN", "min"),
    ("MAX", "max"),
    ("AVG", "avg"),
)


def _op_name(op: Any) -> str:
    """``mscclpp_rs``'s name of a ``ReduceOp`` (or its ``RedOpType``)."""
    kind = getattr(op, "op", op)
    for attr, name in _OPS:
        if kind == getattr(dist.ReduceOp, attr):
            return name
    raise mscclpp_rs.InvalidUsageError(
        f"the mscclpp backend has no reduction {op!r}: sum, product, min, max and avg are offered"
    )


def _staging(fn: Any) -> Any:
    """An operation that may stage CPU tensors (``_args``): if it fails, its device copies are
    dropped, not copied back into the caller's tensors by the next operation's ``_done``."""

    @functools.wraps(fn)
    def run(self: "ProcessGroupMscclpp", *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except BaseException:
            self._staged = []
            raise

    return run


class ProcessGroupMscclpp(dist.ProcessGroup):
    """One group's ranks over an ``mscclpp_rs.Communicator`` (``comm``)."""

    def __init__(
        self, comm: mscclpp_rs.Communicator, rank: int, size: int, uid: Any = None, name: Optional[str] = None
    ):
        super().__init__(rank, size)
        self._comm = comm
        self._rank, self._size = rank, size
        # Rank 0's id holds the bootstrap root's listener: it lives as long as the group.
        self._uid = uid
        self._gpu = comm.backend != "host"
        self._coalescing: Optional[Any] = None
        # A future over this device records an event on its current stream when completed, and
        # its wait() makes the waiter's current stream wait for that event.
        self._devices = [torch.device("cuda", comm.device)] if self._gpu else []
        # (CPU tensor, its device copy) of the operation being enqueued; see _args.
        self._staged: List[Any] = []
        self._name = name

    def _done(self, result: Any) -> Any:
        """The ``Work`` of an operation just enqueued on the current stream (see the module doc)."""
        staged, self._staged = self._staged, []
        for host, dev in staged:  # waits for the operation (a copy to pageable memory)
            host.copy_(dev)
        fut: Future = Future(devices=self._devices)
        fut.set_result(result)
        return _create_work_from_future(fut)

    # --- identity ------------------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 (PyTorch's name)
        return NAME

    def getRank(self) -> int:  # noqa: N802
        return self._rank

    def getSize(self) -> int:  # noqa: N802
        return self._size

    def _get_backend(self, device: Any = None) -> "ProcessGroupMscclpp":
        # torch.distributed asks a group's per-device backend for capabilities (coalescing);
        # a Python group is its own backend on every device.
        return self

    @property
    def group_name(self) -> str:
        # PyTorch keeps a group's name in its device backends, and a Python group is its own
        # backend with none registered: the name PyTorch chose (it registered the group under
        # it) comes from the creator. Functional collectives, DeviceMesh and FSDP2 ask for it.
        if self._name is not None:
            return self._name
        return super().group_name

    @property
    def communicator(self) -> mscclpp_rs.Communicator:
        """The communicator under the group (to register buffers, run plans, ...)."""
        return self._comm

    def _args(self, what: str, *tensors: torch.Tensor) -> List[torch.Tensor]:
        """The tensors a collective runs on: checked, and on a GPU group CPU tensors replaced by
        device copies that ``_done`` copies back. PyTorch's object collectives
        (``all_gather_object``, ``broadcast_object_list``, ...) hand CPU tensors to any backend
        but NCCL's; NCCL's group would refuse them."""
        out = []
        for t in tensors:
            if self._gpu and t.device.type == "cpu":
                if self._coalescing is not None:
                    raise mscclpp_rs.InvalidUsageError(
                        f"{what}: a CPU tensor inside a coalescing block of a GPU group (it would "
                        "be copied back before the block runs); use GPU tensors there"
                    )
                dev = t.to(self._devices[0])
                self._staged.append((t, dev))
                t = dev
            out.append(t)
        self._check(what, *out)
        return out

    def _check(self, what: str, *tensors: torch.Tensor) -> None:
        for t in tensors:
            if not t.is_contiguous():
                raise mscclpp_rs.InvalidUsageError(
                    f"{what}: the mscclpp backend takes contiguous tensors "
                    f"(got one of shape {tuple(t.shape)}, strides {t.stride()})"
                )
            if self._gpu and (t.device.type != "cuda" or t.device.index != self._comm.device):
                raise mscclpp_rs.InvalidUsageError(
                    f"{what}: tensor on {t.device}, but this group's communicator is on "
                    f"{self._comm.backend} device {self._comm.device} (call "
                    "torch.cuda.set_device(local_rank) before init_process_group; for CPU "
                    'tensors use "cpu:gloo,cuda:mscclpp")'
                )
            if not self._gpu and t.device.type != "cpu":
                raise mscclpp_rs.InvalidUsageError(
                    f"{what}: tensor on {t.device}, but this group's communicator runs on the "
                    "host backend (no usable GPU): it takes CPU tensors"
                )

    # --- collectives ---------------------------------------------------------------------------

    @_staging
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        for t in self._args("allreduce", *tensors):
            self._comm.all_reduce(t, op)
        return self._done(tensors)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    @_staging
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        o, i = self._args("all_gather_into_tensor", output, input)
        self._comm.all_gather(o, i)
        return self._done([output])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> Any:
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts)
        return self._done(outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    @_staging
    def allgather(
        self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> Any:
        for outs, inp in zip(output_tensors, input_tensors):
            if len(outs) != self._size:
                raise mscclpp_rs.InvalidUsageError(
                    f"all_gather: {len(outs)} output tensors for {self._size} ranks"
                )
            (i,) = self._args("all_gather", inp)
            flat = torch.empty(self._size * inp.numel(), dtype=inp.dtype, device=i.device)
            self._comm.all_gather(flat, i)
            for r, o in enumerate(self._args("all_gather", *outs)):
                o.copy_(flat[r * inp.numel() : (r + 1) * inp.numel()].view_as(o))
        return self._done(output_tensors)

    @_staging
    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        o, i = self._args("reduce_scatter_tensor", output, input)
        self._comm.reduce_scatter(o, i, op)
        return self._done([output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> Any:
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts)
        return self._done(outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    @_staging
    def reduce_scatter(
        self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any = None
    ) -> Any:
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != self._size:
                raise mscclpp_rs.InvalidUsageError(
                    f"reduce_scatter: {len(ins)} input tensors for {self._size} ranks"
                )
            (o,) = self._args("reduce_scatter", out)
            flat = torch.cat([t.reshape(-1) for t in self._args("reduce_scatter", *ins)])
            self._comm.reduce_scatter(o, flat, op)
        return self._done(output_tensors)

    @_staging
    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        # An all-reduce; ranks other than the root reduce a copy, so that their tensors are left
        # as they were (NCCL's reduce reads them and writes only the root's).
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        root = opts.rootRank if opts is not None else 0
        for t in self._args("reduce", *tensors):
            self._comm.all_reduce(t if self._rank == root else t.clone(), op)
        return self._done(tensors)

    @_staging
    def gather(
        self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> Any:
        (inp,) = self._args("gather", *input_tensors)
        self._rooted("gather", inp, output_tensors, opts.rootRank if opts is not None else 0, True)
        return self._done(output_tensors)

    @_staging
    def scatter(
        self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any = None
    ) -> Any:
        (out,) = self._args("scatter", *output_tensors)
        self._rooted("scatter", out, input_tensors, opts.rootRank if opts is not None else 0, False)
        return self._done(output_tensors)

    def _rooted(self, what: str, mine: torch.Tensor, lists: List[List[torch.Tensor]], root: int,
                to_root: bool) -> None:
        """Gather (``to_root``: every rank's ``mine`` into the root's ``lists[0]``) or scatter
        (the root's ``lists[0]`` into every rank's ``mine``), as sends and receives in a group."""
        if self._rank != root:
            if mine.numel():
                (self._comm.send if to_root else self._comm.recv)(mine, root)
            return
        parts = lists[0] if lists else []
        if len(parts) != self._size:
            raise mscclpp_rs.InvalidUsageError(
                f"{what}: {len(parts)} tensors in the root's list for {self._size} ranks"
            )
        parts = self._args(what, *parts)
        for p, t in enumerate(parts):
            if t.numel() != mine.numel() or t.dtype != mine.dtype:
                raise mscclpp_rs.InvalidUsageError(
                    f"{what}: the root's tensor {p} has {t.numel()} {t.dtype} elements, its own "
                    f"{mine.numel()} {mine.dtype}"
                )
        move = self._comm.recv if to_root else self._comm.send
        with self._comm.group():
            for p, t in enumerate(parts):
                if p != root and t.numel():
                    move(t, p)
        dst, src = (parts[root], mine) if to_root else (mine, parts[root])
        dst.copy_(src.view_as(dst))

    @_staging
    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        for t in self._args("broadcast", *tensors):
            self._comm.broadcast(t, root)
        return self._done(tensors)

    @_staging
    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> Any:
        o, i = self._args("all_to_all_single", output, input)
        if not output_split_sizes and not input_split_sizes:
            self._comm.all_to_all(o, i)
            return self._done([output])
        n = self._size
        outs = _split_rows(o, output_split_sizes, n, "output")
        ins = _split_rows(i, input_split_sizes, n, "input")
        with self._comm.group():
            for p in range(n):
                if ins[p].numel():
                    self._comm.send(ins[p], p)
                if outs[p].numel():
                    self._comm.recv(outs[p], p)
        return self._done([output])

    all_to_all_single = alltoall_base

    def barrier(self, opts: Any = None) -> Any:
        if self._gpu:
            torch.cuda.current_stream().synchronize()
        self._comm.barrier()
        return self._done(None)

    # --- point to point ------------------------------------------------------------------------

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Any:
        self._check("send", *tensors)
        for t in tensors:
            self._comm.send(t, dst)
        return self._done(tensors)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Any:
        if src < 0:
            raise mscclpp_rs.InvalidUsageError(
                "recv: the mscclpp backend has no receive from any source; name the sender"
            )
        self._check("recv", *tensors)
        for t in tensors:
            self._comm.recv(t, src)
        return self._done(tensors)

    # batch_isend_irecv: the sends and receives between start and end run as one group, in
    # which none waits for another (one at a time, a send may wait for a receive queued after
    # it on the peer).
    @property
    def supports_coalescing(self) -> bool:
        return True

    def start_coalescing(self, device: Any = None) -> None:
        if self._coalescing is not None:
            raise mscclpp_rs.InvalidUsageError("start_coalescing: already coalescing")
        self._coalescing = self._comm.group()
        self._coalescing.__enter__()

    def end_coalescing(self, device: Any = None) -> Any:
        group, self._coalescing = self._coalescing, None
        if group is None:
            raise mscclpp_rs.InvalidUsageError("end_coalescing without start_coalescing")
        group.__exit__(None, None, None)
        return self._done(None)

    # PyTorch < 2.12 calls these names.
    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    def __repr__(self) -> str:
        return f"ProcessGroupMscclpp(rank={self._rank}, size={self._size}, backend={self._comm.backend})"


def _split_rows(t: torch.Tensor, splits: Sequence[int], n: int, what: str) -> List[torch.Tensor]:
    """``t`` cut along its first dimension into ``n`` parts (equal where ``splits`` is empty)."""
    rows = t.shape[0] if t.dim() else 1
    if not splits:
        if rows % n:
            raise mscclpp_rs.InvalidUsageError(
                f"all_to_all_single: {what} of {rows} rows is not {n} equal parts"
            )
        splits = [rows // n] * n
    if len(splits) != n or sum(splits) != rows or min(splits) < 0:
        raise mscclpp_rs.InvalidUsageError(
            f"all_to_all_single: {what} split sizes {list(splits)} do not cut {rows} rows into {n} parts"
        )
    flat = t.reshape(rows, -1)
    parts, start = [], 0
    for s in splits:
        parts.append(flat[start : start + s])
        start += s
    return parts


def _create(opts: Any, options: Any = None) -> ProcessGroupMscclpp:
    """The creator ``init_process_group`` / ``new_group`` call (``extended_api``: with
    ``_DistributedBackendOptions``, which carry the group's store and its name; see
    ``ProcessGroupMscclpp.group_name``)."""
    rank, size, store = opts.group_rank, opts.group_size, opts.store
    uid = None
    if rank == 0:
        uid = mscclpp_rs.UniqueId()
        raw = bytes(uid)
        store.set(UID_KEY, raw)
    else:
        raw = bytes(store.get(UID_KEY))
    device = torch.cuda.current_device() if torch.cuda.is_available() else None
    backend = os.environ.get("MSCCLPP_BACKEND") or None
    if device is not None and backend != "host":
        comm = mscclpp_rs.Communicator(raw, rank, size, device=device)
    else:
        comm = mscclpp_rs.Communicator(raw, rank, size, backend=backend)
    return ProcessGroupMscclpp(comm, rank, size, uid, name=getattr(opts, "group_id", None) or None)


def register(name: str = NAME) -> None:
    """Registers the backend under ``name`` (idempotent; done on import for ``NAME``)."""
    if _create_work_from_future is None:
        raise mscclpp_rs.UnavailableError(
            "this PyTorch has no torch._C._distributed_c10d._create_work_from_future "
            "(PyTorch 2.1 or later is needed for the mscclpp backend)"
        )
    if getattr(dist.Backend, name.upper(), None) is not None:
        return
    dist.Backend.register_backend(name, _create, extended_api=True, devices=["cuda", "cpu"])


register()
