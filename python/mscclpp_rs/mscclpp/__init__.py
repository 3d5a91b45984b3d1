"""MSCCL++'s Python API (``import mscclpp``) over ``mscclpp_rs``: the names that software written
for MSCCL++ calls (SGLang's ``pymscclpp.py`` first), mapped onto this library's communicator,
collectives, buffers and plan executor. Written from MSCCL++'s documented names and semantics;
no MSCCL++ code is used.

It is importable as ``mscclpp_rs.mscclpp`` always, and as top-level ``mscclpp`` only where the
user opts in (``MSCCLPP_RS=1`` in the environment, or ``mscclpp_rs.compat.install()``): a real
MSCCL++ installed beside it is never shadowed otherwise. See docs/mscclpp-api.md.
"""

from __future__ import annotations

import enum
import json
import logging
import os
from typing import Any, Dict, Optional, Tuple

import mscclpp_rs as _rs
from mscclpp_rs import _native

__version__ = "0.8.0+mscclpp_rs." + _rs.__version__
version = {"version": __version__, "git_commit": "mscclpp_rs"}
#: Marks this package as the mscclpp_rs implementation (a real MSCCL++ has no such name).
IMPLEMENTATION = "mscclpp_rs"

_log = logging.getLogger("mscclpp_rs.mscclpp")

Communicator = _rs.Communicator
UniqueId = _rs.UniqueId
Error = _rs.Error
MemoryChannel = _rs.MemoryChannel
PortChannel = _rs.PortChannel
MemoryDevice2DeviceSemaphore = _rs.MemorySemaphore
Host2DeviceSemaphore = _rs.HostSemaphore


class DataType(enum.IntEnum):
    """MSCCL++'s ``DataType`` (same names and values)."""

    int32 = 0
    uint32 = 1
    float16 = 2
    float32 = 3
    bfloat16 = 4
    float8_e4m3fn = 5
    float8_e4m3fnuz = 6
    float8_e5m2 = 7
    float8_e5m2fnuz = 8
    uint8 = 9
    float8_e4m3b15 = 10


class ReduceOp(enum.IntEnum):
    """MSCCL++'s ``ReduceOp`` (same names and values)."""

    SUM = 0
    MIN = 3
    NOP = 255


class CommResult(enum.IntEnum):
    """What ``Algorithm.execute`` returns (MSCCL++'s ``CommResult`` codes)."""

    COMM_SUCCESS = 0
    COMM_UNHANDLED_CUDA_ERROR = 1
    COMM_SYSTEM_ERROR = 2
    COMM_INTERNAL_ERROR = 3
    COMM_INVALID_ARGUMENT = 4
    COMM_INVALID_USAGE = 5
    COMM_REMOTE_ERROR = 6
    COMM_IN_PROGRESS = 7


class ErrorCode(enum.IntEnum):
    """MSCCL++'s ``ErrorCode``."""

    SystemError = 0
    InternalError = 1
    RemoteError = 2
    InvalidUsage = 3
    Timeout = 4
    Aborted = 5
    ExecutorError = 6


class PacketType(enum.IntEnum):
    """MSCCL++'s ``PacketType`` (accepted by ``Executor.execute``; the plan decides)."""

    LL8 = 0
    LL16 = 1


# Our element type names; None: MSCCL++ has the type but our collectives do not.
_DTYPE_NAMES = {
    DataType.int32: "int32",
    DataType.uint32: "uint32",
    DataType.float16: "float16",
    DataType.float32: "float32",
    DataType.bfloat16: "bfloat16",
    DataType.float8_e4m3fn: "float8_e4m3fn",
    DataType.float8_e5m2: "float8_e5m2",
    DataType.uint8: "uint8",
}
_DTYPE_SIZES = {"int32": 4, "uint32": 4, "float16": 2, "float32": 4, "bfloat16": 2,
                "float8_e4m3fn": 1, "float8_e5m2": 1, "uint8": 1}


def _dtype_name(dtype) -> Optional[str]:
    try:
        return _DTYPE_NAMES.get(DataType(int(dtype)))
    except (ValueError, TypeError):
        return None


def _comm_of(comm) -> "_rs.Communicator":
    if isinstance(comm, CommGroup):
        return comm.communicator
    if isinstance(comm, _rs.Communicator):
        return comm
    raise TypeError(f"comm: expected mscclpp.CommGroup(...).communicator, got {type(comm).__name__}")


class _Pointer:
    """``nbytes`` at address ``ptr`` on ``comm``'s device, as a DLPack array of ``dtype`` (what
    the collectives take): how raw addresses (MSCCL++'s ints) reach them. Not owned."""

    __slots__ = ("ptr", "nbytes", "dtype", "backend", "ordinal")

    def __init__(self, comm, ptr: int, nbytes: int, dtype: str):
        self.ptr, self.nbytes, self.dtype = int(ptr), int(nbytes), dtype
        self.backend, self.ordinal = comm.backend, comm.device

    def __dlpack_device__(self):
        return {"cuda": (2, self.ordinal), "rocm": (10, self.ordinal)}.get(self.backend, (1, 0))

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return _native._pointer_capsule(self.ptr, self.nbytes, self.dtype, self.backend, self.ordinal)


def _stream_arg(comm, stream) -> Optional[int]:
    # The host backend has no streams: its calls complete before they return.
    if comm.backend == "host":
        return None
    return int(stream) if stream is not None else 0


def _code_of(e: BaseException) -> int:
    """MSCCL++'s code for a configuration that cannot run; other failures propagate."""
    if isinstance(e, _rs.UnavailableError):
        return int(CommResult.COMM_INVALID_USAGE)
    if isinstance(e, _rs.InvalidUsageError):
        return int(CommResult.COMM_INVALID_ARGUMENT)
    raise e


class RawGpuBuffer:
    """MSCCL++'s ``RawGpuBuffer(nbytes)``: device memory of the library (``mscclpp_rs.alloc``,
    memory the peers can map), zeroed, on the current device; ``to_dlpack`` hands it to torch."""

    def __init__(self, nelems: int, granularity: Any = None, *, device: Optional[int] = None,
                 backend: Optional[str] = None):
        if device is None and backend is None:
            device = _current_torch_device()
        self._buf = _native.alloc(int(nelems), device=device, backend=backend)

    def nelems(self) -> int:
        return self._buf.nbytes

    def bytes(self) -> int:
        return self._buf.nbytes

    def data(self) -> int:
        return self._buf.ptr

    def device_id(self) -> int:
        return self._buf.__dlpack_device__()[1]

    @property
    def buffer(self) -> "_rs.Buffer":
        """The ``mscclpp_rs.Buffer`` behind it (channels, ``register``)."""
        return self._buf

    def to_dlpack(self, data_type: Any = "uint8", shape=(), strides=()):
        """A DLPack capsule of ``data_type`` (``str(torch.float16)`` and the like) over the whole
        buffer, or ``shape``/``strides`` (elements) inside it."""
        return self._buf.to_dlpack(data_type, list(shape) or None, list(strides) or None)

    def __dlpack__(self, **kw):
        return self._buf.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._buf.__dlpack_device__()


def _current_torch_device() -> Optional[int]:
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.current_device()
    except Exception:  # a torch without a working runtime: let the library pick
        pass
    return None


class TcpBootstrap:
    """MSCCL++'s ``TcpBootstrap``: ``create(rank, n)``, ``create_unique_id()`` (rank 0),
    ``initialize(unique_id or "[if:]ip:port")``; ``Communicator(bootstrap)`` is
    ``CommGroup``'s work here, so ``communicator`` is made at ``initialize``."""

    def __init__(self, rank: int, n_ranks: int):
        self._rank, self._n = rank, n_ranks
        self.communicator: Optional[_rs.Communicator] = None

    @classmethod
    def create(cls, rank: int, n_ranks: int) -> "TcpBootstrap":
        return cls(rank, n_ranks)

    def create_unique_id(self) -> "_rs.UniqueId":
        return _rs.UniqueId()

    def initialize(self, unique_id, timeout_sec: float = 30, *, device=None, backend=None):
        if device is None and backend is None:
            device = _current_torch_device()
        self.communicator = _rs.Communicator(unique_id, self._rank, self._n, device=device,
                                             backend=backend)

    def get_rank(self) -> int:
        return self._rank

    def get_n_ranks(self) -> int:
        return self._n

    def get_n_ranks_per_node(self) -> int:
        return _ranks_per_node(self.communicator)

    def barrier(self):
        self.communicator.barrier()


def _ranks_per_node(comm) -> int:
    env = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    if env:
        return int(env)
    return comm.size  # our collectives serve the ranks of one host


class CommGroup:
    """MSCCL++'s ``CommGroup``: ranks bootstrapped through a torch.distributed group
    (``torch_group=``: rank 0's unique id is broadcast over it, so a CPU/Gloo group serves),
    an mpi4py communicator (``mpi_comm=``), or ``interfaceIpPortTrio="[if:]ip:port"`` with
    ``rank``/``size``. ``communicator`` is the ``mscclpp_rs.Communicator`` of this rank.

    ``device``/``backend`` (ours): as for ``mscclpp_rs.Communicator`` (default: torch's current
    CUDA device where torch is imported, else the library's choice)."""

    def __init__(self, mpi_comm=None, torch_group=None, interfaceIpPortTrio: str = "",
                 rank: Optional[int] = None, size: Optional[int] = None, *, device=None,
                 backend=None):
        if interfaceIpPortTrio:
            if rank is None or size is None or rank < 0 or size < 1:
                raise ValueError("CommGroup: interfaceIpPortTrio needs rank >= 0 and size >= 1")
            uid = interfaceIpPortTrio
        elif mpi_comm is not None:
            rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
            uid = mpi_comm.bcast(bytes(_rs.UniqueId()) if rank == 0 else None, 0)
        elif torch_group is not None:
            import torch.distributed as dist

            rank, size = dist.get_rank(torch_group), dist.get_world_size(torch_group)
            box = [bytes(_rs.UniqueId()) if rank == 0 else None]
            dist.broadcast_object_list(box, src=dist.get_global_rank(torch_group, 0),
                                       group=torch_group)
            uid = box[0]
        else:
            raise RuntimeError("CommGroup: pass torch_group=, mpi_comm= or interfaceIpPortTrio=")
        self.bootstrap = TcpBootstrap(rank, size)
        self.bootstrap.initialize(uid, device=device, backend=backend)
        self.communicator = self.bootstrap.communicator
        self.my_rank = self.communicator.rank
        self.nranks = self.communicator.size
        self.nranks_per_node = _ranks_per_node(self.communicator)
        self.nranks_per_ipc_domain = self.ipc_domain_n_ranks = self.nranks_per_node

    def barrier(self):
        self.communicator.barrier()

    def register(self, tensor):
        """Collective: the peers map ``tensor``'s memory, so all-reduces reading from it are zero
        copy where that pays (``mscclpp_rs.Communicator.register``)."""
        return self.communicator.register(tensor)


class ExecutionPlan:
    """MSCCL++'s ``ExecutionPlan(plan_path, rank)``: the JSON its DSL emits (a path, or the JSON
    text itself), run by ``Executor.execute`` through ``mscclpp_rs.Communicator.execute_plan``."""

    def __init__(self, plan: str, rank: int = 0):
        text = plan if plan.lstrip().startswith("{") else open(plan, encoding="utf-8").read()
        meta = json.loads(text)
        self.text = text
        self.rank = rank
        self.name = meta.get("name", "")
        self.collective = meta.get("collective", "")
        self.min_message_size = int(meta.get("min_message_size", 0))
        self.max_message_size = int(meta.get("max_message_size", 2**64 - 1))
        self.in_place = bool(meta.get("inplace", False))


class Executor:
    """MSCCL++'s ``Executor(communicator)``: runs ``ExecutionPlan``s on raw addresses."""

    def __init__(self, comm):
        self.comm = _comm_of(comm)

    def execute(self, rank: int, send_buff: int, recv_buff: int, send_buff_size: int,
                recv_buff_size: int, data_type, plan: ExecutionPlan, stream: int = 0,
                packet_type: PacketType = PacketType.LL16):
        name = _dtype_name(data_type)
        if name is None:
            raise _rs.InvalidUsageError(f"Executor.execute: data type {data_type!r} is not served")
        send = _Pointer(self.comm, send_buff, send_buff_size, name)
        recv = _Pointer(self.comm, recv_buff, recv_buff_size, name)
        self.comm.execute_plan(plan.text, send, recv, stream=_stream_arg(self.comm, stream))

    def reset(self):
        """Nothing to release: plans' staged buffers live with the communicator."""


# --- algorithms (mscclpp.ext.AlgorithmCollectionBuilder) -------------------------------------

_NO_LIMIT = 2**64 - 1


class Algorithm:
    """One of MSCCL++'s default algorithms by name, or a compiled DSL plan. Every native
    all-reduce name runs this library's all-reduce (which picks LL, LL128 or direct by size);
    ``nblocks``/``nthreads_per_block`` are checked as MSCCL++ checks them and otherwise steer
    nothing; NVLS names return ``COMM_INVALID_USAGE`` (this package makes no multicast objects)."""

    class Constraint:
        def __init__(self, world_size: int = 0, n_ranks_per_node: int = 0):
            self.world_size, self.n_ranks_per_node = world_size, n_ranks_per_node

    def __init__(self, name: str, collective: str = "allreduce", *, max_blocks: int = 0,
                 min_blocks_peers: bool = False, nvls: bool = False,
                 plan: Optional[ExecutionPlan] = None, tags: Optional[Dict[str, int]] = None,
                 constraint: Optional["Algorithm.Constraint"] = None):
        self.name, self.collective = name, collective
        self._max_blocks, self._min_blocks_peers, self._nvls = max_blocks, min_blocks_peers, nvls
        self._plan = plan
        self.tags = dict(tags or {})
        self.constraint = constraint or Algorithm.Constraint()
        if plan is not None:
            self._range = (plan.min_message_size, plan.max_message_size)
        else:
            self._range = (0, _NO_LIMIT)
        self._warned = False

    @property
    def message_size_range(self) -> Tuple[int, int]:
        return self._range

    def set_message_size_range(self, min_message_size: int, max_message_size: int):
        if self.is_dsl_algorithm():
            raise TypeError("set_message_size_range is only supported for native algorithms")
        self._range = (int(min_message_size), int(max_message_size))

    def is_dsl_algorithm(self) -> bool:
        return self._plan is not None

    def is_native_algorithm(self) -> bool:
        return self._plan is None

    def reset(self):
        """MSCCL++ drops its per-buffer contexts; this library keeps none per algorithm."""

    def _check_launch(self, comm, nblocks: int, nthreads: int) -> int:
        if nthreads < 0 or nthreads > 1024 or nblocks < 0:
            return int(CommResult.COMM_INVALID_ARGUMENT)
        if nblocks and self._max_blocks and nblocks > self._max_blocks:
            return int(CommResult.COMM_INVALID_ARGUMENT)
        if nblocks and nthreads and self._min_blocks_peers and nblocks < comm.size - 1:
            return int(CommResult.COMM_INVALID_ARGUMENT)
        return 0

    def execute(self, comm, input_buffer: int, output_buffer: int, input_size: int,
                output_size: int, dtype, op=ReduceOp.NOP, stream: int = 0,
                executor: Optional[Executor] = None, nblocks: int = 0,
                nthreads_per_block: int = 0, symmetric_memory: bool = False,
                extras: Optional[Dict[str, int]] = None, accum_dtype=None) -> int:
        """Runs on ``stream``; returns 0, or MSCCL++'s code where the configuration cannot run
        (an unserved type or operator, a launch shape MSCCL++ refuses, NVLS, more than one host).
        In place when ``input_buffer == output_buffer``. ``symmetric_memory``, ``extras`` and
        ``accum_dtype`` (other than the data type itself) are accepted and change nothing."""
        c = _comm_of(comm)
        if self._nvls:
            if not self._warned:
                _log.info("%s: NVLink multicast is not used by mscclpp_rs: COMM_INVALID_USAGE",
                          self.name)
                self._warned = True
            return int(CommResult.COMM_INVALID_USAGE)
        name = _dtype_name(dtype)
        if name is None or (accum_dtype is not None and _dtype_name(accum_dtype) != name):
            return int(CommResult.COMM_INVALID_ARGUMENT)
        rc = self._check_launch(c, int(nblocks), int(nthreads_per_block))
        if rc:
            return rc
        s = _stream_arg(c, stream)
        try:
            if self._plan is not None:
                send = _Pointer(c, input_buffer, input_size, name)
                recv = _Pointer(c, output_buffer, output_size, name)
                c.execute_plan(self._plan.text, send, recv, stream=s)
                return 0
            if self.collective == "allreduce":
                if int(op) == ReduceOp.SUM:
                    rop = "sum"
                elif int(op) == ReduceOp.MIN:
                    rop = "min"
                else:
                    return int(CommResult.COMM_INVALID_ARGUMENT)
                if input_size != output_size:
                    return int(CommResult.COMM_INVALID_ARGUMENT)
                x = _Pointer(c, input_buffer, input_size, name)
                out = x if output_buffer == input_buffer else _Pointer(c, output_buffer, output_size, name)
                c.all_reduce(x, rop, out=out, stream=s)
                return 0
            if self.collective == "allgather":
                if output_size != input_size * c.size:
                    return int(CommResult.COMM_INVALID_ARGUMENT)
                inp = _Pointer(c, input_buffer, input_size, name)
                out = _Pointer(c, output_buffer, output_size, name)
                c.all_gather(out, inp, stream=s)
                return 0
        except _rs.Error as e:
            return _code_of(e)
        return int(CommResult.COMM_INVALID_USAGE)

    def __repr__(self):
        return f"Algorithm({self.name!r}, collective={self.collective!r}, range={self._range})"


# MSCCL++'s default native algorithms: (name, collective, max blocks, blocks >= peers, NVLS).
_DEFAULTS = (
    ("default_allreduce_allpair_packet", "allreduce", 64, True, False),
    ("default_allreduce_nvls_packet", "allreduce", 16, False, True),
    ("default_allreduce_nvls_warp_pipeline", "allreduce", 0, False, True),
    ("default_allreduce_nvls_block_pipeline", "allreduce", 0, False, True),
    ("default_allreduce_packet", "allreduce", 112, True, False),
    ("default_allreduce_nvls_zero_copy", "allreduce", 0, False, True),
    ("default_allreduce_fullmesh", "allreduce", 0, False, False),
    ("default_allreduce_rsag", "allreduce", 0, False, False),
    ("default_allreduce_rsag_pipeline", "allreduce", 0, False, False),
    ("default_allreduce_rsag_zero_copy", "allreduce", 0, False, False),
    ("default_allgather_fullmesh", "allgather", 0, False, False),
    ("default_allgather_fullmesh2", "allgather", 0, False, False),
)


class AlgorithmCollection:
    def __init__(self, algorithms=()):
        self._algorithms = list(algorithms)

    def __iter__(self):
        return iter(self._algorithms)

    def __len__(self):
        return len(self._algorithms)

    def __getitem__(self, index: int) -> Algorithm:
        return self._algorithms[index]

    def get_by_collective(self, collective: str):
        return [a for a in self._algorithms if a.collective == collective]

    def register_algorithm(self, collective: str, algo_name: str, algorithm: Algorithm):
        self._algorithms.append(algorithm)


def _default_algorithms(scratch_buffer: int, scratch_buffer_size: int, rank: int):
    # The scratch buffer is MSCCL++'s working memory; this library stages through its own.
    return AlgorithmCollection(
        Algorithm(n, coll, max_blocks=mb, min_blocks_peers=peers, nvls=nvls)
        for n, coll, mb, peers, nvls in _DEFAULTS
    )


# --- the DSL (mscclpp.language, mscclpp.compile) ----------------------------------------------


class DslCompiler:
    """``mscclpp.compile(algo, spec, rank, **kw)``: runs MSCCL++'s DSL program ``algo(spec,
    **kw)`` (its ``mscclpp.language``, which must be installed: it is MSCCL++'s, not ours) and
    returns an ``Algorithm`` that runs the plan's JSON through this library's executor."""

    def __call__(self, algo, algo_spec, rank: int, **kwargs) -> Algorithm:
        return self.compile(algo, algo_spec, rank, **kwargs)

    def compile(self, algo, algo_spec, rank: int, **kwargs) -> Algorithm:
        if not callable(algo):
            raise ValueError("The 'algo' argument must be a callable (e.g., a function or class).")
        prog = algo(algo_spec, **kwargs)
        prog.post_process_operations()
        text = prog.to_json(indent=None, separators=(",", ":"), ensure_ascii=False)
        plan = ExecutionPlan(text, rank)
        return Algorithm(
            plan.name or getattr(algo_spec, "name", ""), plan.collective or "allreduce",
            plan=plan, tags=getattr(algo_spec, "tags", None),
            constraint=Algorithm.Constraint(getattr(algo_spec, "world_size", 0),
                                            getattr(algo_spec, "nranks_per_node", 0)))


compile = DslCompiler()


def is_nvls_supported() -> bool:
    """False: this package never creates NVLink multicast objects."""
    return False


def __getattr__(name):
    # Submodules on first use (``mscclpp.ext``, ``mscclpp.language``, ``mscclpp.default_algos``).
    if name in ("ext", "language", "default_algos"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'mscclpp' (mscclpp_rs) has no attribute {name!r}")


__all__ = [
    "Algorithm", "AlgorithmCollection", "CommGroup", "CommResult", "Communicator", "DataType",
    "DslCompiler", "Error", "ErrorCode", "ExecutionPlan", "Executor", "Host2DeviceSemaphore",
    "MemoryChannel", "MemoryDevice2DeviceSemaphore", "PacketType", "PortChannel", "RawGpuBuffer",
    "ReduceOp", "TcpBootstrap", "UniqueId", "compile", "is_nvls_supported", "version",
    "__version__",
]
