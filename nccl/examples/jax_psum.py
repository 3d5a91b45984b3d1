#!/usr/bin/env python3
"""JAX (XLA's NCCL collectives) on libmscclpp_nccl.so: N processes, one device each (they may
share one GPU), ``pmap`` psum/pmax/all_gather and ``process_allgather``, checked exactly.

XLA does not resolve NCCL through the dynamic linker's symbol search, so ``LD_PRELOAD`` alone
does not reach it: its CUDA plugin ``dlopen``s ``libnccl.so.2`` by that bare name and looks
each function up in that handle. glibc answers a bare name with an already-loaded object whose
``DT_SONAME`` is that name, so a copy of our library whose SONAME is ``libnccl.so.2``, loaded
before JAX starts, is what XLA gets (``docs/nccl.md``, "JAX and XLA"). Give that copy as
``MSCCLPP_JAX_SHIM`` (this script loads it first) or ``LD_PRELOAD`` it.

    MSCCLPP_JAX_SHIM=/path/libnccl.so.2 python3 nccl/examples/jax_psum.py --nproc 2

Prints one PASS/FAIL line per check and per rank; exits non-zero if any failed.
"""
import argparse
import ctypes
import os
import socket
import subprocess
import sys


def rank_main(pid, n, port):
    shim = os.environ.get("MSCCLPP_JAX_SHIM")
    if shim:
        ctypes.CDLL(shim)  # before jax: XLA's dlopen("libnccl.so.2") then returns it
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=n, process_id=pid, local_device_ids=[0])
    failed = 0

    def check(name, fn):
        nonlocal failed
        try:
            fn()
            print(f"[rank {pid}] PASS {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every check
            failed += 1
            print(f"[rank {pid}] FAIL {name}: {type(e).__name__}: {e}", flush=True)

    h = ctypes.CDLL("libnccl.so.2")
    served = "mscclpp" if hasattr(h, "mscclppNcclShim") else "the real NCCL"
    print(f"[rank {pid}] libnccl.so.2 resolves to {served}", flush=True)
    def served_by_mscclpp():
        assert served == "mscclpp", f"XLA's libnccl.so.2 is {served}"

    check("served_by_mscclpp", served_by_mscclpp)
    check("topology", lambda: np.testing.assert_equal(
        (jax.process_count(), jax.local_device_count(), jax.device_count()), (n, 1, n)))
    x = jnp.arange(4099, dtype=jnp.float32)[None] * (pid + 1)
    want_sum = np.arange(4099, dtype=np.float64) * sum(range(1, n + 1))

    def psum():
        y = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(x)
        np.testing.assert_array_equal(np.asarray(y)[0], want_sum.astype(np.float32))

    def pmax():
        y = jax.pmap(lambda v: jax.lax.pmax(v, "i"), axis_name="i")(x)
        np.testing.assert_array_equal(np.asarray(y)[0], (np.arange(4099) * n).astype(np.float32))

    def all_gather():
        g = jax.pmap(lambda v: jax.lax.all_gather(v, "i"), axis_name="i")(x)
        for r in range(n):
            np.testing.assert_array_equal(np.asarray(g)[0, r], (np.arange(4099) * (r + 1)).astype(np.float32))

    def psum_bf16():
        xb = (jnp.arange(1000) % 7).astype(jnp.bfloat16)[None] * (pid + 1)
        y = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(xb)
        want = (np.arange(1000) % 7) * sum(range(1, n + 1))
        np.testing.assert_array_equal(np.asarray(y, dtype=np.float32)[0], want.astype(np.float32))

    def process_allgather():
        a = multihost_utils.process_allgather(np.full((4,), pid, np.int32))
        assert a.shape == (n, 4) and (a[:, 0] == np.arange(n)).all(), a
        b = multihost_utils.process_allgather(jnp.ones((8,), jnp.float32) * pid, tiled=True)
        assert b.shape == (8 * n,) and all(float(b[8 * r]) == r for r in range(n)), b

    for name, fn in (("psum", psum), ("pmax", pmax), ("all_gather", all_gather),
                     ("psum_bf16", psum_bf16), ("process_allgather", process_allgather)):
        check(name, fn)
    multihost_utils.sync_global_devices("done")
    jax.distributed.shutdown()
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=int(os.environ.get("JAX_PSUM_NPROC", "2")))
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank is not None:
        sys.exit(rank_main(a.rank, a.nproc, a.port))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", JAX_PLATFORMS="cuda")
    procs = [subprocess.Popen([sys.executable, __file__, "--nproc", str(a.nproc), "--rank", str(r),
                               "--port", str(port)], env=env) for r in range(a.nproc)]
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=170))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append("timeout")
    print(f"# jax_psum: exit codes {rcs}", flush=True)
    sys.exit(0 if all(rc == 0 for rc in rcs) else 1)


if __name__ == "__main__":
    main()
