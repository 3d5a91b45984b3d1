"""Channels, semaphores and compiled kernels: the handles' bytes and data through their
addresses on the host backend (2 processes), clear errors for bad arguments, and on GPUs a
ping-pong over a memory channel in a kernel compiled from a Python string."""

import pytest

import mscclpp_rs
from cases import HANDLE_SIZES

BAD = {
    "peer_self": ("InvalidUsageError", ["memory_semaphore: peer", "not another rank"]),
    "peer_range": ("InvalidUsageError", ["peer 3"]),
    "numpy_on_host": ("InvalidUsageError", ["Communicator.alloc", "ndarray"]),
    "transport": ("InvalidUsageError", ["carrier-pigeon", "CudaIpc"]),
    "fifo_size": ("InvalidUsageError", ["fifo_size=3", "power of two"]),
    "alloc_zero": ("InvalidUsageError", ["nbytes"]),
    "read_range": ("InvalidUsageError", ["60..68", "64-byte"]),
    "write_range": ("InvalidUsageError", ["0..65", "64-byte"]),
    "compile_host": ("UnavailableError", ["host backend has no device compiler"]),
    "compile_module_host": ("UnavailableError", ["host backend has no device compiler"]),
}


def test_channel_handles_host(host2):
    handles = host2.run("channel_handles")
    for rank_handles in handles:
        assert [len(h) for h in rank_handles] == list(HANDLE_SIZES.values())
    # Each rank's tokens are its own memory: the handles differ between the ranks.
    assert handles[0][0] != handles[1][0]
    # The set-up can be repeated (the first set was freed when its case returned).
    again = host2.run("channel_handles")
    assert [len(h) for h in again[1]] == list(HANDLE_SIZES.values())


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_channel_arguments(host2, case):
    cls, words = BAD[case]
    for mro, msg in host2.run("bad_channel_call", which=case):
        assert cls in mro, (cls, mro, msg)
        for w in words:
            assert w in msg, (w, msg)
    host2.run("barrier")  # the ranks are still in step after the errors


def test_compile_kernel_on_host():
    with pytest.raises(mscclpp_rs.UnavailableError, match="no device compiler"):
        mscclpp_rs.compile_kernel('extern "C" __global__ void k() {}', "k", backend="host")
    with pytest.raises(mscclpp_rs.InvalidUsageError, match="device="):
        mscclpp_rs.compile_kernel("", "k", device="gpu0")


def test_gpu_memory_channel_ping_pong(gpu2):
    assert gpu2.run("gpu_ping_pong", rounds=100, count=1000) == [100, 100]


def test_gpu_memory_channel_ping_pong_on_torch_tensors(gpu2):
    assert gpu2.run("gpu_ping_pong", rounds=100, count=1000, tensors=True) == [100, 100]


def test_stubs_name_the_channel_api():
    """The stubs declare every channel class and method the extension has, and each has a
    docstring."""
    import ast
    import os

    here = os.path.dirname(mscclpp_rs.__file__)
    tree = ast.parse(open(os.path.join(here, "__init__.pyi")).read())
    stubs = {n.name: {f.name for f in n.body if isinstance(f, ast.FunctionDef)}
             for n in tree.body if isinstance(n, ast.ClassDef)}
    stubs[""] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for cls in ("Buffer", "MemorySemaphore", "HostSemaphore", "MemoryChannel", "PortChannel", "Kernel"):
        obj = getattr(mscclpp_rs, cls)
        public = {m for m in dir(obj) if not m.startswith("_")}
        assert public <= stubs[cls], (cls, public - stubs[cls])
        for m in public:
            assert getattr(obj, m).__doc__, (cls, m)
    comm_methods = {"alloc", "memory_semaphore", "host_semaphore", "memory_channel", "port_channel", "compile_kernel"}
    assert comm_methods <= stubs["Communicator"]
    for m in comm_methods:
        assert getattr(mscclpp_rs.Communicator, m).__doc__, m
    assert "compile_kernel" in stubs[""] and mscclpp_rs.compile_kernel.__doc__
