"""Rank-side cases of test_mscclpp_api.py: each runs in a spawned process as one rank, with a
communicator made through the `mscclpp` API (CommGroup) on the host backend (NumPy arrays)."""

import json
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

ALLREDUCE_NATIVE = [
    "default_allreduce_allpair_packet", "default_allreduce_packet", "default_allreduce_fullmesh",
    "default_allreduce_rsag", "default_allreduce_rsag_pipeline", "default_allreduce_rsag_zero_copy",
]
NVLS = [
    "default_allreduce_nvls_packet", "default_allreduce_nvls_warp_pipeline",
    "default_allreduce_nvls_block_pipeline", "default_allreduce_nvls_zero_copy",
]


def _bf16_bits(x):
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _bits_bf16(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def default_algorithms(group, mscclpp):
    """Every default all-reduce on fp32/fp16/int32/bf16 from 512 B to 64 KiB, in and out of place;
    NVLS names refused with MSCCL++'s code; bad launch shapes, types and operators refused."""
    import mscclpp.ext as ext

    comm, rank, n = group.communicator, group.my_rank, group.nranks
    executor = mscclpp.Executor(comm)
    scratch = mscclpp.RawGpuBuffer(1 << 20)
    algos = ext.AlgorithmCollectionBuilder().build_default_algorithms(
        scratch_buffer=scratch.data(), scratch_buffer_size=scratch.bytes(), rank=rank)
    by_name = {a.name: a for a in algos}
    out = {"names": sorted(by_name), "codes": {}}
    for name in ALLREDUCE_NATIVE:
        a = by_name[name]
        for dt, npt in [("float32", np.float32), ("float16", np.float16), ("int32", np.int32),
                        ("bfloat16", np.uint16)]:
            for nbytes in (512, 4096, 65536):
                count = nbytes // np.dtype(npt).itemsize
                vals = (np.arange(count) % 7 + rank + 1).astype(np.float32)
                x = _bf16_bits(vals) if dt == "bfloat16" else vals.astype(npt)
                want = sum((np.arange(count) % 7 + r + 1) for r in range(n)).astype(np.float32)
                for inplace in (True, False):
                    src = x.copy()
                    dst = src if inplace else np.full_like(src, 0x55)
                    rc = a.execute(comm=comm, executor=executor, input_buffer=src.ctypes.data,
                                   output_buffer=dst.ctypes.data, input_size=src.nbytes,
                                   output_size=dst.nbytes, dtype=getattr(mscclpp.DataType, dt),
                                   op=mscclpp.ReduceOp.SUM, stream=0, nblocks=n, nthreads_per_block=512,
                                   symmetric_memory=False)
                    assert rc == 0, (name, dt, nbytes, rc)
                    got = _bits_bf16(dst) if dt == "bfloat16" else dst.astype(np.float32)
                    assert np.array_equal(got, want), (name, dt, nbytes, inplace, got[:4], want[:4])
                    if not inplace:
                        assert np.array_equal(src, x), (name, "input changed")
        a.set_message_size_range(0, 2 << 20)
        assert a.message_size_range == (0, 2 << 20)
        a.reset()
    x = np.ones(256, np.float32)
    kw = dict(comm=comm, executor=executor, input_buffer=x.ctypes.data, output_buffer=x.ctypes.data,
              input_size=x.nbytes, output_size=x.nbytes, stream=0)
    for name in NVLS:
        out["codes"][name] = by_name[name].execute(dtype=mscclpp.DataType.float32,
                                                    op=mscclpp.ReduceOp.SUM, nblocks=8,
                                                    nthreads_per_block=512, **kw)
    pkt = by_name["default_allreduce_packet"]
    f32, s = mscclpp.DataType.float32, mscclpp.ReduceOp.SUM
    out["codes"]["packet_113_blocks"] = pkt.execute(dtype=f32, op=s, nblocks=113, nthreads_per_block=512, **kw)
    out["codes"]["threads_2048"] = pkt.execute(dtype=f32, op=s, nblocks=8, nthreads_per_block=2048, **kw)
    out["codes"]["nop"] = pkt.execute(dtype=f32, op=mscclpp.ReduceOp.NOP, **kw)
    out["codes"]["fnuz"] = pkt.execute(dtype=mscclpp.DataType.float8_e4m3fnuz, op=s, **kw)
    out["codes"]["min"] = pkt.execute(dtype=f32, op=mscclpp.ReduceOp.MIN, **kw)
    # An all-gather by name.
    ag = by_name["default_allgather_fullmesh2"]
    mine = np.full(64, rank + 1, np.int32)
    every = np.zeros(64 * n, np.int32)
    rc = ag.execute(comm=comm, executor=executor, input_buffer=mine.ctypes.data,
                    output_buffer=every.ctypes.data, input_size=mine.nbytes,
                    output_size=every.nbytes, dtype=mscclpp.DataType.int32, stream=0)
    assert rc == 0 and np.array_equal(every, np.repeat(np.arange(1, n + 1), 64)), (rc, every)
    return out


def raw_buffer(group, mscclpp):
    """RawGpuBuffer: zeroed library memory, seen through DLPack typed and untyped."""
    buf = mscclpp.RawGpuBuffer(4096)
    assert buf.bytes() == 4096 and buf.data() != 0

    class Cap:  # NumPy takes objects with __dlpack__, not bare capsules
        def __init__(self, c, dev):
            self.c, self.dev = c, dev

        def __dlpack__(self, **kw):
            return self.c

        def __dlpack_device__(self):
            return self.dev

    raw = np.from_dlpack(buf)
    assert raw.dtype == np.uint8 and raw.shape == (4096,) and not raw.any()
    dev = buf.__dlpack_device__()
    f = np.from_dlpack(Cap(buf.to_dlpack(data_type="torch.float32"), dev))
    assert f.dtype == np.float32 and f.shape == (1024,)
    # NumPy marks unversioned DLPack imports read-only: write through the Buffer, read in NumPy.
    buf.buffer.write(np.full(1024, group.my_rank + 1, np.float32).tobytes())
    assert float(f[0]) == group.my_rank + 1  # the same memory, not a copy
    m = np.from_dlpack(Cap(buf.to_dlpack("float16", shape=(32, 64)), dev))
    assert m.shape == (32, 64)
    # The library's collectives take the capsule's view as any array, in place.
    group.communicator.all_reduce(Cap(buf.to_dlpack("float32"), dev))
    want = sum(r + 1 for r in range(group.nranks))
    # The capsules keep the memory alive after the Python buffer object is gone.
    del buf
    assert float(f.sum()) == want * 1024, f[:4]
    try:
        mscclpp.RawGpuBuffer(64).to_dlpack("float32", shape=(17,))
    except Exception as e:
        return type(e).__name__, str(e)
    return None


def executor_plan(group, mscclpp):
    """Executor.execute + ExecutionPlan (path) on raw addresses, as MSCCL++'s."""
    import tempfile

    import cases

    n, rank = group.nranks, group.my_rank
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cases.allreduce_plan(n), f)
    plan = mscclpp.ExecutionPlan(f.name, rank)
    assert plan.collective == "allreduce", plan.collective
    count = n * 1024
    x = (np.arange(count) % 5 + rank).astype(np.float32)
    out = np.zeros_like(x)
    mscclpp.Executor(group.communicator).execute(rank, x.ctypes.data, out.ctypes.data, x.nbytes,
                                                 out.nbytes, mscclpp.DataType.float32, plan, 0)
    want = sum((np.arange(count) % 5 + r) for r in range(n)).astype(np.float32)
    assert np.array_equal(out, want), out[:4]
    return plan.name


def dsl_multi_node(group, mscclpp):
    """SGLang's multi-node path: ``mscclpp.compile`` of MSCCL++'s ``allreduce_multi_nodes`` (its
    DSL, from MSCCLPP_DSL_PATH) for the ranks' two hosts, then ``execute`` in place, sum, every
    element checked against NumPy, at two sizes of the plan's range."""
    import mscclpp.default_algos as d
    from mscclpp.language.collectives import AllReduce
    from mscclpp.language.utils import AlgoSpec

    n, rank = group.nranks, group.my_rank
    spec = AlgoSpec(name="allreduce_2nodes", collective=AllReduce(n, 1, True),
                    nranks_per_node=n // 2, world_size=n, in_place=True, instances=1,
                    protocol="LL", auto_sync=False, num_threads_per_block=1024,
                    reuse_resources=True, use_double_scratch_buffer=True,
                    min_message_size=1 << 10, max_message_size=64 << 10, tags={"default": 1})
    algo = mscclpp.compile(d.allreduce_multi_nodes, spec, rank, thread_block_group_size=1)
    done = []
    for count in (n * 64, n * 1024):
        x = ((np.arange(count) * 7 + rank * 3) % 11).astype(np.float32)
        want = sum(((np.arange(count) * 7 + r * 3) % 11) for r in range(n)).astype(np.float32)
        rc = algo.execute(group.communicator, x.ctypes.data, x.ctypes.data, x.nbytes, x.nbytes,
                          mscclpp.DataType.float32, mscclpp.ReduceOp.SUM)
        assert rc == 0, f"execute returned {rc}"
        group.barrier()
        assert np.array_equal(x, want), (count, x[:4], want[:4])
        done.append(x.nbytes)
    return algo.name, done


def serve(rank, size, addr, case, conn, env):
    os.environ.update(env)
    try:
        import mscclpp_rs.compat

        mscclpp = mscclpp_rs.compat.install()
        group = mscclpp.CommGroup(interfaceIpPortTrio=addr, rank=rank, size=size, backend="host")
        result = globals()[case](group, mscclpp)
        group.barrier()
        conn.send(("ok", result))
    except BaseException as e:
        conn.send(("err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
