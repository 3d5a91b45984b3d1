import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from cluster import Cluster  # noqa: E402

HOST = {"MSCCLPP_BACKEND": "host"}


# One cluster per fixture for the whole session (starting ranks costs seconds), replaced when a
# case broke it so that one failure does not time out every later case of the session.
_CLUSTERS = {}


def _cluster(key, size, env, **options):
    c = _CLUSTERS.get(key)
    if c is not None and c.broken:
        c.close()
        c = None
    if c is None:
        c = _CLUSTERS[key] = Cluster(size, env=env, **options)
    return c


@pytest.fixture(scope="session", autouse=True)
def _close_clusters():
    yield
    for c in _CLUSTERS.values():
        c.close()
    _CLUSTERS.clear()


@pytest.fixture
def host2():
    """Two ranks on the host backend (NumPy arrays)."""
    return _cluster("host2", 2, HOST, backend="host")


@pytest.fixture
def host4():
    """Four ranks on the host backend."""
    return _cluster("host4", 4, HOST, backend="host")


@pytest.fixture
def host3():
    """Three ranks on the host backend: a rank count that is not a power of two."""
    return _cluster("host3", 3, HOST, backend="host")


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


@pytest.fixture
def gpu2():
    """Two ranks on GPUs (one each where there are two; sharing one otherwise), torch tensors."""
    n, why = _gpu_ranks()
    if not n:
        pytest.skip(f"GPU tests skipped: {why}")
    return _cluster("gpu2", 2, {})
