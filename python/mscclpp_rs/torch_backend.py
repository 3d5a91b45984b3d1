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

#: The Work class a Python subclass overrides ``wait``/``get_future`` of (PyWork trampoline).
_WorkBase = getattr(dist, "Work", None) or getattr(dist, "_Work")


class _DeferredWork(_WorkBase):
    """The ``Work`` of a send or receive made outside a coalescing block.

    PyTorch's ``batch_isend_irecv`` batches only for groups whose type is exactly
    ``ProcessGroup``; for a Python group (this one) it calls ``isend``/``irecv`` one at a time and
    then waits for each. Launched one at a time, a send of several rounds waits for its receiver
    while the receiver's own send, ahead of its receive on its stream, waits too: a deadlock that
    ends in the kernel's spin limit ("unspecified launch failure"). So such operations are kept
    until one of their ``Work`` is waited for (or another operation of the group is made), and
    then launched together as one group, in which none waits for another — as NCCL runs
    ``ncclSend``/``ncclRecv`` between ``ncclGroupStart`` and ``ncclGroupEnd``."""

    def __init__(self, pg: "ProcessGroupMscclpp"):
        super().__init__()
        self._pg = pg
        self._work: Any = None  # the launched group's Work, set by ProcessGroupMscclpp._flush_p2p

    def _launched(self) -> Any:
        if self._work is None:
            self._pg._flush_p2p()
        return self._work

    def wait(self, timeout: Any = None) -> bool:
        self._launched().wait()
        return True

    def get_future(self) -> Future:
        return self._launched().get_future()

    def is_completed(self) -> bool:
        return self._launched().is_completed()

    def is_success(self) -> bool:
        return self._launched().is_success()

    def exception(self) -> Any:
        return None

    def synchronize(self) -> None:
        self.wait()

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


def _reduction(opts: Any) -> Any:
    """``(name, factor)`` of ``opts.reduceOp``: ``mscclpp_rs``'s name of the reduction, and for
    ``PREMUL_SUM`` (``dist._make_nccl_premul_sum(factor)``) its factor, a float or a one-element
    tensor (the reduction is then a sum of every rank's input times its own factor, as NCCL's);
    otherwise None."""
    op = getattr(opts, "reduceOp", None)
    if op is None:
        return "sum", None
    if not getattr(op, "op", op) == dist.ReduceOp.PREMUL_SUM:
        return _op_name(op), None
    # The factor is not an attribute of ReduceOp; its pickled state carries it: (op, factor).
    state = op.__getstate__() if hasattr(op, "__getstate__") else None
    factor = state[1] if isinstance(state, tuple) and len(state) == 2 else None
    if isinstance(factor, (list, tuple)) and len(factor) == 1:  # older PyTorch: a list of one
        factor = factor[0]
    if not isinstance(factor, (float, int, torch.Tensor)) or isinstance(factor, bool):
        raise mscclpp_rs.InvalidUsageError(
            f"the mscclpp backend cannot read the factor of {op!r} (made with "
            "torch.distributed._make_nccl_premul_sum(factor)?)"
        )
    return "sum", factor


def _premul(t: torch.Tensor, factor: Any) -> torch.Tensor:
    """``t`` multiplied in place by a ``PREMUL_SUM`` factor (none: ``t`` as it is)."""
    if factor is None:
        return t
    if isinstance(factor, torch.Tensor):
        if factor.numel() != 1:
            raise mscclpp_rs.InvalidUsageError(
                f"PREMUL_SUM: the factor tensor has {factor.numel()} elements, not 1"
            )
        factor = factor.reshape(()).to(t.device)
    return t.mul_(factor)


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
        self, comm: mscclpp_rs.Communicator, rank: int, size: int, uid: Any = None, name: Optional[str] = None,
        store: Any = None,
    ):
        super().__init__(rank, size)
        self._comm = comm
        self._rank, self._size = rank, size
        # Rank 0's id holds the bootstrap root's listener: it lives as long as the group.
        self._uid = uid
        self._gpu = comm.backend != "host"
        self._coalescing: Optional[Any] = None
        # Sends and receives made outside a coalescing block, not launched yet:
        # (kind, tensor, peer, stream or None, its _DeferredWork); see _DeferredWork.
        self._p2p: List[Any] = []
        # A future over this device records an event on its current stream when completed, and
        # its wait() makes the waiter's current stream wait for that event.
        self._devices = [torch.device("cuda", comm.device)] if self._gpu else []
        # (CPU tensor, its device copy) of the operation being enqueued; see _args.
        self._staged: List[Any] = []
        self._name = name
        # The group's store (PyTorch's, prefixed for it): split_group bootstraps through it.
        self._store = store
        self._splits = 0
        if self._gpu:
            # dist.split_group refuses a default group bound to no device. PyTorch binds the
            # group it makes itself (init_process_group's device_id), then replaces that group
            # by a Python one: the binding has to be made here.
            try:
                self.bound_device_id = self._devices[0]
            except AttributeError:  # pragma: no cover - PyTorch < 2.3 has no bound device
                pass

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
        self._flush_p2p()
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
        op, factor = _reduction(opts)
        for t in self._args("allreduce", *tensors):
            self._comm.all_reduce(_premul(t, factor), op)
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
        op, factor = _reduction(opts)
        o, i = self._args("reduce_scatter_tensor", output, input)
        if factor is not None:
            i = _premul(i.clone(), factor)  # the input is left as it was
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
        op, factor = _reduction(opts)
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != self._size:
                raise mscclpp_rs.InvalidUsageError(
                    f"reduce_scatter: {len(ins)} input tensors for {self._size} ranks"
                )
            (o,) = self._args("reduce_scatter", out)
            flat = torch.cat([t.reshape(-1) for t in self._args("reduce_scatter", *ins)])
            self._comm.reduce_scatter(o, _premul(flat, factor), op)
        return self._done(output_tensors)

    @_staging
    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        # An all-reduce; ranks other than the root reduce a copy, so that their tensors are left
        # as they were (NCCL's reduce reads them and writes only the root's).
        op, factor = _reduction(opts)
        root = opts.rootRank if opts is not None else 0
        for t in self._args("reduce", *tensors):
            self._comm.all_reduce(_premul(t if self._rank == root else t.clone(), factor), op)
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

    @_staging
    def alltoall(
        self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> Any:
        # dist.all_to_all(out_list, in_list): input_tensors[p] goes to rank p, output_tensors[p]
        # comes from rank p (any sizes: each pair agrees on its own). Without this method
        # PyTorch's C++ ProcessGroup.alltoall asks for the group's CUDA backend, which a Python
        # group has none of ("No backend type associated with device type cuda").
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise mscclpp_rs.InvalidUsageError(
                f"all_to_all: {len(output_tensors)} output and {len(input_tensors)} input tensors "
                f"for {n} ranks"
            )
        outs = self._args("all_to_all", *output_tensors)
        ins = self._args("all_to_all", *input_tensors)
        me = self._rank
        if outs[me].numel() != ins[me].numel():
            raise mscclpp_rs.InvalidUsageError(
                f"all_to_all: rank {me}'s output tensor {me} has {outs[me].numel()} elements, "
                f"its input tensor {me} {ins[me].numel()}"
            )
        with self._comm.group():
            for p in range(n):
                if p != me and ins[p].numel():
                    self._comm.send(ins[p], p)
                if p != me and outs[p].numel():
                    self._comm.recv(outs[p], p)
        outs[me].copy_(ins[me].view_as(outs[me]))
        return self._done(output_tensors)

    def barrier(self, opts: Any = None) -> Any:
        self._flush_p2p()
        if self._gpu:
            torch.cuda.current_stream().synchronize()
        self._comm.barrier()
        return self._done(None)

    # --- split_group -----------------------------------------------------------------------------

    # dist.split_group asks the default group's (CUDA) backend, which is this group, whether it
    # splits, for its options, and then calls split_group on the parent; new_group and
    # init_process_group(device_id=...) call the other two on a group bound to a device.
    @property
    def supports_splitting(self) -> bool:
        return True

    @property
    def options(self) -> Any:
        return None

    def split_group(
        self,
        ranks: Sequence[int],
        timeout: Any = None,
        opts: Any = None,
        group_name: Optional[str] = None,
        group_desc: Optional[str] = None,
        *_: Any,
        **__: Any,
    ) -> Optional["ProcessGroupMscclpp"]:
        """The group of ``ranks`` (this group's ranks), over a communicator of their own made
        through this group's store; None on a rank not among them. Every rank of this group
        calls it, in the same order (PyTorch's rule for split_group)."""
        self._splits += 1
        ranks = sorted(int(r) for r in ranks)
        if self._rank not in ranks:
            return None
        if self._store is None:
            raise mscclpp_rs.InvalidUsageError("split_group: this group was made without a store")
        if group_name is None:
            group_name = f"{self._name}:split:{self._splits}"
        store = dist.PrefixStore(f"mscclpp_rs/split/{self._splits}/{group_name}/", self._store)
        rank = ranks.index(self._rank)
        comm, uid = _communicator(store, rank, len(ranks))
        pg = ProcessGroupMscclpp(comm, rank, len(ranks), uid, name=group_name, store=store)
        if group_desc is not None and hasattr(pg, "_set_group_desc"):
            pg._set_group_desc(group_desc)
        return pg

    splitGroup = split_group  # the C++ name (PyProcessGroup's trampoline looks it up)

    def perform_nocolor_split(self, device: Any = None) -> None:
        """new_group on a rank outside the new group (NCCL's ncclCommSplit needs every rank)."""

    def eager_connect_single_device(self, device: Any = None) -> None:
        """The communicator is connected when the group is made."""

    def _set_sequence_number_for_group(self) -> None:
        """split_group calls it; PyTorch's sequence numbers are Gloo's and NCCL's."""

    # --- point to point ------------------------------------------------------------------------

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Any:
        self._check("send", *tensors)
        return self._p2p_op("send", tensors, dst)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Any:
        if src < 0:
            raise mscclpp_rs.InvalidUsageError(
                "recv: the mscclpp backend has no receive from any source; name the sender"
            )
        self._check("recv", *tensors)
        return self._p2p_op("recv", tensors, src)

    def _p2p_op(self, kind: str, tensors: List[torch.Tensor], peer: int) -> Any:
        if not 0 <= peer < self._size:
            raise mscclpp_rs.InvalidUsageError(f"{kind}: peer {peer} is not a rank of {self._size}")
        if self._coalescing is not None:  # inside the open group: launched at its end
            move = self._comm.send if kind == "send" else self._comm.recv
            for t in tensors:
                move(t, peer)
            return self._done(tensors)
        work = _DeferredWork(self)
        stream = torch.cuda.current_stream() if self._gpu else None
        for t in tensors:
            self._p2p.append((kind, t, peer, stream, work))
        return work

    def _flush_p2p(self) -> None:
        """Launches the kept sends and receives (see _DeferredWork): each run of them made on one
        stream as one group on that stream, in the order they were made."""
        while self._p2p:
            stream = self._p2p[0][3]
            n = 1
            while n < len(self._p2p) and self._p2p[n][3] == stream:
                n += 1
            batch, self._p2p = self._p2p[:n], self._p2p[n:]
            ctx = torch.cuda.stream(stream) if stream is not None else _no_context()
            with ctx:
                h = stream.cuda_stream if stream is not None else None
                with self._comm.group():
                    for kind, t, peer, _, _ in batch:
                        (self._comm.send if kind == "send" else self._comm.recv)(t, peer, stream=h)
                # Recorded on the stream the group ran on; each Work's wait orders the waiter's.
                work = self._done(None)
            for *_, w in batch:
                w._work = work

    # Coalescing: the sends and receives between start and end run as one group, in which none
    # waits for another. PyTorch 2.11's batch_isend_irecv does not coalesce for a Python group
    # (its type is not exactly ProcessGroup): there the deferral of _DeferredWork groups them.
    @property
    def supports_coalescing(self) -> bool:
        return True

    def start_coalescing(self, device: Any = None) -> None:
        self._flush_p2p()
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


class _no_context:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


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
    comm, uid = _communicator(store, rank, size)
    return ProcessGroupMscclpp(comm, rank, size, uid, name=getattr(opts, "group_id", None) or None, store=store)


def _communicator(store: Any, rank: int, size: int) -> Any:
    """``(communicator, uid)`` of ``size`` ranks bootstrapped through ``store``: rank 0 makes
    the id (``uid``, kept by its group; None on the others) and publishes it there."""
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
    if rank == 0:
        # Every rank has joined (the bootstrap is collective), so each read the id. Remove it:
        # destroy_process_group resets PyTorch's group names, so the next init_process_group
        # uses the same keys of a store that may outlive this group (torchrun's agent store),
        # and a rank reading this id then would dial a root that is gone.
        try:
            store.delete_key(UID_KEY)
        except Exception:  # noqa: BLE001 - a store without deletion: the id stays (harmless)
            pass
    return comm, uid


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
