#!/usr/bin/env python3
"""CuPy's NCCL binding (`cupy.cuda.nccl`) over our library, one PASS/FAIL line per case and rank.

A client we did not write: CuPy calls `ncclGetUniqueId`, `ncclCommInitRank`, the collectives,
and `ncclSend`/`ncclRecv` inside `ncclGroupStart`/`ncclGroupEnd` through its own Cython
binding. The script starts its ranks itself (multiprocessing, 'spawn'); rank 0 makes the unique
id and hands it to the others through a queue. Ranks use device `rank % device_count`, so two
ranks may share one GPU. Every result is checked exactly against NumPy.

    LD_PRELOAD=/path/to/libmscclpp_nccl.so python3 nccl/examples/cupy_nccl.py [--nproc 2]

Exits non-zero if any case failed or any rank died. Rank 0 prints which NCCL libraries are
mapped in its process (`/proc/self/maps`), to tell whether CuPy reached the preloaded one.
"""
import argparse
import faulthandler
import multiprocessing as mp
import queue
import sys
import time
import traceback

import numpy as np


def vals(rank, n, salt, dtype):
    # small integers in [-30, 30]: sums over up to 16 ranks are exact in every type used here
    i = np.arange(n, dtype=np.int64)
    return ((i * (2 * rank + 1) + 13 * salt + rank) % 61 - 30).astype(dtype)


def nccl_libraries():
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if "nccl" in path:
                    libs.add(path)
    except OSError:
        pass
    return sorted(libs)


def worker(rank, world, uid_q, res_q):
    faulthandler.dump_traceback_later(60, exit=True)
    import cupy as cp
    from cupy.cuda import nccl

    ndev = cp.cuda.runtime.getDeviceCount()
    cp.cuda.Device(rank % ndev).use()
    if rank == 0:
        uid = nccl.get_unique_id()
        for _ in range(world - 1):
            uid_q.put(uid)
    else:
        uid = uid_q.get(timeout=60)
    comm = nccl.NcclCommunicator(world, uid, rank)
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()  # CuPy's own copies and fills run on the stream NCCL is given
    sp = stream.ptr
    if rank == 0:
        print(f"# cupy {cp.__version__}, NCCL runtime version {nccl.get_version()} "
              f"(CuPy built against {nccl.get_build_version()}), {world} ranks on {ndev} device(s)", flush=True)
        print(f"# nccl libraries mapped: {' '.join(nccl_libraries()) or 'none'}", flush=True)

    types = {"float32": (np.float32, nccl.NCCL_FLOAT32), "float16": (np.float16, nccl.NCCL_FLOAT16),
             "float64": (np.float64, nccl.NCCL_FLOAT64), "int32": (np.int32, nccl.NCCL_INT32)}

    def put(a):
        d = cp.asarray(a)
        cp.cuda.Device().synchronize()
        return d

    def poison(n, dtype):
        out = cp.empty(n, dtype=dtype)
        out.fill(-99 if np.dtype(dtype).kind == "i" else np.nan)
        cp.cuda.Device().synchronize()
        return out

    def equal(got, want, what):
        stream.synchronize()
        g = cp.asnumpy(got)
        if not np.array_equal(g, want):
            bad = np.flatnonzero(g != want)
            raise AssertionError(f"{what}: {bad.size} of {want.size} wrong (first at {bad[0]}: "
                                 f"got {g[bad[0]]}, want {want[bad[0]]})")

    def all_in(n, salt, dtype):
        return [vals(r, n, salt, dtype) for r in range(world)]

    def c_allreduce():
        for tname, (dt, nt) in types.items():
            for opname, op, red in (("sum", nccl.NCCL_SUM, np.sum), ("max", nccl.NCCL_MAX, np.max)):
                n = 10007
                x, y = put(vals(rank, n, 1, dt)), poison(n, dt)
                comm.allReduce(x.data.ptr, y.data.ptr, n, nt, op, sp)
                equal(y, red(np.stack(all_in(n, 1, dt)), axis=0).astype(dt), f"{tname} {opname}")

    def c_allreduce_inplace():
        n = 4099
        x = put(vals(rank, n, 2, np.float32))
        comm.allReduce(x.data.ptr, x.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, sp)
        equal(x, np.sum(np.stack(all_in(n, 2, np.float32)), axis=0), "in place")

    def c_allgather():
        n = 3001
        x, y = put(vals(rank, n, 3, np.float32)), poison(world * n, np.float32)
        comm.allGather(x.data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, sp)
        equal(y, np.concatenate(all_in(n, 3, np.float32)), "allGather")

    def c_reducescatter():
        n = 2048
        x, y = put(vals(rank, world * n, 4, np.int32)), poison(n, np.int32)
        comm.reduceScatter(x.data.ptr, y.data.ptr, n, nccl.NCCL_INT32, nccl.NCCL_SUM, sp)
        want = np.sum(np.stack(all_in(world * n, 4, np.int32)), axis=0)[rank * n:(rank + 1) * n]
        equal(y, want.astype(np.int32), "reduceScatter")

    def c_bcast():
        n, root = 70000, world - 1
        x = put(vals(rank, n, 5, np.float32))
        comm.bcast(x.data.ptr, n, nccl.NCCL_FLOAT32, root, sp)
        equal(x, vals(root, n, 5, np.float32), "bcast")

    def c_broadcast():
        n, root = 5003, 0
        x, y = put(vals(rank, n, 6, np.float64)), poison(n, np.float64)
        comm.broadcast(x.data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT64, root, sp)
        equal(y, vals(root, n, 6, np.float64), "broadcast")

    def c_reduce():
        n, root = 5000, world - 1
        x, y = put(vals(rank, n, 7, np.float32)), poison(n, np.float32)
        comm.reduce(x.data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, root, sp)
        if rank == root:
            equal(y, np.sum(np.stack(all_in(n, 7, np.float32)), axis=0), "reduce")
        else:
            stream.synchronize()

    def c_sendrecv_ring():
        n = 65536
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        x, y = put(vals(rank, n, 8, np.float32)), poison(n, np.float32)
        nccl.groupStart()
        comm.send(x.data.ptr, n, nccl.NCCL_FLOAT32, nxt, sp)
        comm.recv(y.data.ptr, n, nccl.NCCL_FLOAT32, prv, sp)
        nccl.groupEnd()
        equal(y, vals(prv, n, 8, np.float32), f"from rank {prv}")

    def c_alltoall_sendrecv():
        n = 1000
        # the chunk for peer p: vals(rank * world + p, ...)
        xs = {p: put(vals(rank * world + p, n, 9, np.int32)) for p in range(world)}
        ys = {p: poison(n, np.int32) for p in range(world)}
        nccl.groupStart()
        for p in range(world):
            comm.send(xs[p].data.ptr, n, nccl.NCCL_INT32, p, sp)
            comm.recv(ys[p].data.ptr, n, nccl.NCCL_INT32, p, sp)
        nccl.groupEnd()
        for p in range(world):
            equal(ys[p], vals(p * world + rank, n, 9, np.int32), f"from rank {p}")

    def c_memory_kinds():
        # Memory NCCL serves besides cudaMalloc: managed memory, page-locked host memory (one
        # address for host and device), and a stream-ordered pool's (cudaMallocAsync).
        n = 5000
        want = np.sum(np.stack(all_in(n, 10, np.float32)), axis=0)
        managed = cp.ndarray((n,), np.float32, cp.cuda.malloc_managed(n * 4))
        managed[...] = put(vals(rank, n, 10, np.float32))
        cp.cuda.Device().synchronize()
        comm.allReduce(managed.data.ptr, managed.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, sp)
        equal(managed, want, "managed memory")
        pinned = cp.cuda.alloc_pinned_memory(n * 4)
        host = np.frombuffer(pinned, np.float32, n)
        host[:] = vals(rank, n, 10, np.float32)
        comm.allReduce(pinned.ptr, pinned.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, sp)
        stream.synchronize()
        if not np.array_equal(host, want):
            raise AssertionError(f"page-locked host memory: {np.count_nonzero(host != want)} wrong")
        pool = cp.cuda.MemoryAsyncPool()
        pooled = cp.ndarray((n,), np.float32, pool.malloc(n * 4))
        pooled[...] = put(vals(rank, n, 10, np.float32))
        cp.cuda.Device().synchronize()
        out = poison(n, np.float32)
        comm.allReduce(pooled.data.ptr, out.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, sp)
        equal(out, want, "stream-ordered pool")

    cases = [("allReduce", c_allreduce), ("allReduce_inplace", c_allreduce_inplace),
             ("allGather", c_allgather), ("reduceScatter", c_reducescatter), ("bcast", c_bcast),
             ("broadcast", c_broadcast), ("reduce", c_reduce),
             ("send_recv_ring_group", c_sendrecv_ring), ("alltoall_send_recv_group", c_alltoall_sendrecv),
             ("memory_kinds", c_memory_kinds)]
    failed = []
    for name, fn in cases:
        faulthandler.dump_traceback_later(50, exit=True)
        try:
            fn()
            ok, detail = True, ""
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
            failed.append(name)
        print(f"[rank {rank}] {'PASS' if ok else 'FAIL'} cupy_{name} {detail}".rstrip(), flush=True)
    faulthandler.dump_traceback_later(50, exit=True)
    try:
        comm.destroy()
    except Exception as e:  # noqa: BLE001
        print(f"[rank {rank}] FAIL cupy_destroy {type(e).__name__}: {e}", flush=True)
        failed.append("destroy")
    faulthandler.cancel_dump_traceback_later()
    print(f"[rank {rank}] SUMMARY {len(cases) - len([f for f in failed if f != 'destroy'])}/{len(cases)} ok"
          + (f"; FAILED: {failed}" if failed else ""), flush=True)
    res_q.put((rank, failed))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240, help="seconds to wait for the ranks")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    uid_q, res_q = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.nproc, uid_q, res_q), name=f"rank{r}")
             for r in range(args.nproc)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + args.timeout
    while len(results) < len(procs) and time.monotonic() < deadline:
        try:
            rank, failed = res_q.get(timeout=1)
            results[rank] = failed
        except queue.Empty:
            # every rank that has not reported is gone: nothing more will come
            if all(not p.is_alive() for r, p in enumerate(procs) if r not in results):
                break
    bad = False
    for r, p in enumerate(procs):
        p.join(timeout=30)
        if p.is_alive():
            print(f"FAIL rank {r} still running; terminating", flush=True)
            p.terminate()
            p.join(timeout=10)
            bad = True
        elif p.exitcode != 0:
            print(f"FAIL rank {r} exited with {p.exitcode}", flush=True)
            bad = True
        if r not in results:
            bad = True
        elif results[r]:
            bad = True
    print(f"# cupy_nccl: {args.nproc} ranks, {'FAILED' if bad else 'all passed'}", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
