"""mscclpp_rs: GPU communication for Python, from the Rust redesign of MSCCL++.

One wheel serves NVIDIA (CUDA) and AMD (ROCm) GPUs, whose libraries are opened at run time,
and a CPU host backend (NumPy arrays) where there is no GPU. ::

    import mscclpp_rs
    comm = mscclpp_rs.Communicator.from_env()        # under torchrun, mpirun or srun
    comm.all_reduce(tensor)                          # in place, on torch's current stream

Logging goes to standard error at the level of ``MSCCLPP_LOG_LEVEL`` (default ``warn``).
"""

from ._errors import (
    Error,
    InternalError,
    InvalidUsageError,
    RemoteError,
    SystemFailureError,
    TimeoutError,
    UnavailableError,
)
from ._native import (
    Buffer,
    Communicator,
    ExpertExchange,
    Group,
    HostSemaphore,
    Kernel,
    MemoryChannel,
    MemorySemaphore,
    PortChannel,
    RegisteredBuffer,
    UniqueId,
    __version__,
    compile_kernel,
    compiled_backends,
    default_backend,
    probe_backends,
)

__all__ = [
    "Buffer",
    "Communicator",
    "Error",
    "ExpertExchange",
    "Group",
    "HostSemaphore",
    "InternalError",
    "InvalidUsageError",
    "Kernel",
    "MemoryChannel",
    "MemorySemaphore",
    "PortChannel",
    "RegisteredBuffer",
    "RemoteError",
    "SystemFailureError",
    "TimeoutError",
    "UnavailableError",
    "UniqueId",
    "__version__",
    "compile_kernel",
    "compiled_backends",
    "default_backend",
    "probe_backends",
]
