"""``torch.distributed`` with the ``mscclpp`` backend (``mscclpp_rs.torch_backend``): PyTorch's
own collective API, batch_isend_irecv and DDP on 2 ranks, checked against references computed
on every rank. Skipped, with the reason, where torch is not installed (CI) or, for the GPU case,
where torch sees no GPU our library can use."""

import multiprocessing as mp
import queue as queue_mod

import pytest

from cluster import DEADLINE_S, free_port

torch = pytest.importorskip("torch", reason="torch is not installed")


def _run(kind, size=2):
    import torch_ranks

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=torch_ranks.main, args=(r, size, port, kind, q), daemon=True) for r in range(size)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(size):
            rank, status, detail = q.get(timeout=DEADLINE_S)
            results[rank] = (status, detail)
    except queue_mod.Empty:
        pytest.fail(f"ranks {sorted(set(range(size)) - set(results))} did not finish within {DEADLINE_S} s; done: {results}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    bad = {r: v for r, v in results.items() if v[0] != "ok"}
    assert not bad, "\n".join(f"rank {r}: {s}: {d}" for r, (s, d) in sorted(bad.items()))
    assert all(v[1] == "mscclpp" for v in results.values()), results


def test_torch_backend_host():
    _run("host")


def test_torch_backend_gpu():
    from conftest import _gpu_ranks

    n, why = _gpu_ranks()
    if not n:
        pytest.skip(f"GPU tests skipped: {why}")
    _run("cuda")
