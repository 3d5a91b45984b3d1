"""Construction, bad arguments (clear exceptions, on every rank), dead peers, one-rank
communicators and the package's metadata."""

import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest

import mscclpp_rs
from cluster import Cluster, free_port, from_env_rank, uid_rank

HOST = {"MSCCLPP_BACKEND": "host"}

BAD = {
    # case: (exception class, words the message must contain)
    "op": ("InvalidUsageError", ["median", "sum"]),
    "sizes": ("InvalidUsageError", ["input of 3", "output of 8"]),
    "dtypes": ("InvalidUsageError", ["float32", "float64"]),
    "dtype_size": ("InvalidUsageError", ["float16", "2 bytes", "float32"]),
    "dtype_name": ("InvalidUsageError", ["complex32", "bfloat16"]),
    "not_contiguous": ("InvalidUsageError", ["not contiguous"]),
    "not_an_array": ("TypeError", ["__dlpack__", "list"]),
    "root": ("InvalidUsageError", ["root"]),
    "peer": ("InvalidUsageError", ["peer"]),
    "stream": ("InvalidUsageError", ["host backend has no native streams"]),
    "bool_reduce": ("InvalidUsageError", ["bool"]),
    "int16": ("InvalidUsageError", ["dtype="]),
    "alltoall_blocks": ("InvalidUsageError", ["equal blocks"]),
    "plan_json": ("InvalidUsageError", ["plan"]),
    "plan_path": ("InvalidUsageError", ["/nonexistent/plan.json"]),
    "register_host": ("UnavailableError", ["host backend"]),
    "readonly": ("BufferError", ["readonly"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments(host2, case):
    cls, words = BAD[case]
    for mro, msg in host2.run("bad_call", which=case):
        assert cls in mro, (cls, mro, msg)
        if cls.endswith("Error") and cls not in ("TypeError", "BufferError"):
            assert "Error" in mro and "ValueError" in mro or cls != "InvalidUsageError"
        for w in words:
            assert w in msg, (w, msg)
    host2.run("barrier")  # the ranks are still in step after the errors


def test_dead_peer_is_an_error():
    c = Cluster(2, env=HOST, backend="host")
    try:
        c.conns[1].send(("die", {"rank": 1}))
        c.conns[1].poll(10)
        c.procs[1].join(10)
        c.conns[0].send(("all_reduce_expecting_failure", {}))
        assert c.conns[0].poll(60), "rank 0 hung on a dead peer"
        status, (mro, msg) = c.conns[0].recv()
        assert status == "ok"
        assert "Error" in mro and "rank 1" in msg, (mro, msg)
    finally:
        c.kill()


def _spawn(target, args_by_rank):
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=target, args=a, daemon=True) for a in args_by_rank]
    for p in ps:
        p.start()
    return ps


def test_from_env_torchrun_variables():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    ps = _spawn(from_env_rank, [(r, port, q) for r in range(2)])
    got = sorted([q.get(timeout=120) for _ in ps], key=str)
    for p in ps:
        p.join(30)
    assert got == [(0, 2, 0, [3.0] * 5), (1, 2, 1, [3.0] * 5)], got


def test_unique_id_pickled_to_the_other_rank():
    ctx = mp.get_context("spawn")
    to_1, out = ctx.Queue(), ctx.Queue()
    ps = _spawn(uid_rank, [(0, None, out), (1, to_1, out)])
    first = out.get(timeout=120)
    assert isinstance(first, bytes), first
    to_1.put(first)
    got = sorted([out.get(timeout=120) for _ in ps], key=str)
    for p in ps:
        p.join(30)
    assert got == [(0, [0, 2, 4, 6]), (1, [0, 2, 4, 6])], got


def test_unique_id_bytes():
    uid = mscclpp_rs.UniqueId.from_bytes(bytes(mscclpp_rs.UniqueId("127.0.0.1:0")))
    assert len(bytes(uid)) == 128 and uid.root.startswith("127.0.0.1:")
    assert pickle.loads(pickle.dumps(uid)) == uid
    with pytest.raises(mscclpp_rs.Error, match="128 bytes"):
        mscclpp_rs.UniqueId.from_bytes(b"short")
    with pytest.raises(mscclpp_rs.InvalidUsageError, match="not an"):
        mscclpp_rs.UniqueId("nonsense")


def test_construction_errors(monkeypatch):
    with pytest.raises(mscclpp_rs.InvalidUsageError, match="rank 2"):
        mscclpp_rs.Communicator(f"127.0.0.1:{free_port()}", 2, 2, backend="host")
    with pytest.raises(mscclpp_rs.InvalidUsageError, match="gpu"):
        mscclpp_rs.Communicator(f"127.0.0.1:{free_port()}", 0, 1, backend="gpu")
    with pytest.raises(TypeError, match="UniqueId"):
        mscclpp_rs.Communicator(3.5, 0, 1)
    monkeypatch.setenv("RANK", "zero")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(mscclpp_rs.InvalidUsageError, match="RANK"):
        mscclpp_rs.Communicator.from_env(backend="host")


def test_one_rank():
    with mscclpp_rs.Communicator(f"127.0.0.1:{free_port()}", 0, 1, backend="host") as comm:
        assert (comm.rank, comm.size, comm.backend) == (0, 1, "host")
        x = np.arange(10, dtype=np.float32)
        out = np.full(10, np.nan, np.float32)
        comm.all_reduce(x, out=out)
        assert (out == x).all()
        y = np.zeros(10, np.float32)
        with comm.group():
            comm.send(x, 0)
            comm.recv(y, 0)
        assert (y == x).all()
        comm.barrier()
    with pytest.raises(mscclpp_rs.InvalidUsageError, match="closed"):
        comm.all_reduce(x)


def test_package():
    assert mscclpp_rs.__version__
    assert "host" in mscclpp_rs.compiled_backends()
    probe = mscclpp_rs.probe_backends()
    assert probe["host"] is None and set(probe) == {"cuda", "rocm", "host"}
    for name in ("cuda", "rocm"):  # absent GPUs say why
        assert probe[name] is None or "not available" in probe[name]
    assert issubclass(mscclpp_rs.InvalidUsageError, ValueError)
    assert issubclass(mscclpp_rs.TimeoutError, TimeoutError)
    here = os.path.dirname(mscclpp_rs.__file__)
    assert os.path.exists(os.path.join(here, "py.typed"))
    assert os.path.exists(os.path.join(here, "__init__.pyi"))
    assert mscclpp_rs.Communicator.all_reduce.__doc__


def test_nccl_nvls_check_refuses_where_multicast_is_disabled_only_for_us(monkeypatch):
    # The benchmark runs it before torch.distributed loads the real NCCL.
    check = mscclpp_rs._native.check_nccl_nvls
    monkeypatch.setenv("MSCCLPP_FORCE_DISABLE_NVLS", "1")
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    with pytest.raises(mscclpp_rs.InvalidUsageError, match="NCCL_NVLS_ENABLE"):
        check("the test")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    check("the test")
