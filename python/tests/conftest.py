import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from cluster import Cluster  # noqa: E402

HOST = {"MSCCLPP_BACKEND": "host"}


def _cluster(size, env, **options):
    c = Cluster(size, env=env, **options)
    yield c
    c.close()


@pytest.fixture(scope="session")
def host2():
    """Two ranks on the host backend (NumPy arrays)."""
    yield from _cluster(2, HOST, backend="host")


@pytest.fixture(scope="session")
def host4():
    """Four ranks on the host backend."""
    yield from _cluster(4, HOST, backend="host")


@pytest.fixture(scope="session")
def host3():
    """Three ranks on the host backend: a rank count that is not a power of two."""
    yield from _cluster(3, HOST, backend="host")


def _gpu_ranks():
    """How many GPU ranks torch can run here, or why none."""
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed"
    if not torch.cuda.is_available():
        return 0, "torch sees no CUDA/ROCm device"
    import mscclpp_rs

    probe = mscclpp_rs.probe_backends()
    backend = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    if probe.get(backend):
        return 0, probe[backend]
    return 2, None


@pytest.fixture(scope="session")
def gpu2():
    """Two ranks on GPUs (one each where there are two; sharing one otherwise), torch tensors."""
    n, why = _gpu_ranks()
    if not n:
        pytest.skip(f"GPU tests skipped: {why}")
    yield from _cluster(2, {})
