#!/usr/bin/env python3
"""Smoke test of libmscclpp_nccl.so under PyTorch (NCCL process group), one line per op.

Run on a GPU node, e.g. with 2 GPUs:

    LD_PRELOAD=/path/to/libmscclpp_nccl.so \
    MSCCLPP_NCCL_LIB_PATH=/path/to/libnccl.so.2 \   # optional: send/recv etc. need it
    MSCCLPP_LOG_LEVEL=info \
    torchrun --nproc_per_node=2 nccl/examples/torch_smoke.py

Prints PASS/FAIL per operation on every rank and exits non-zero if anything failed.
Without MSCCLPP_NCCL_LIB_PATH, send/recv is expected to fail (reported as SKIP-EXPECTED).
"""
import os
import sys
import traceback

import torch
import torch.distributed as dist

results = []


def report(name, ok, detail=""):
    rank = dist.get_rank() if dist.is_initialized() else -1
    tag = "PASS" if ok is True else ("FAIL" if ok is False else ok)
    print(f"[rank {rank}] {tag} {name} {detail}", flush=True)
    results.append((name, ok))


def run(name, fn):
    try:
        fn()
        report(name, True)
    except Exception as e:  # noqa: BLE001
        report(name, False, f"{type(e).__name__}: {e}")
        traceback.print_exc()


def main():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    have_fallback = bool(os.environ.get("MSCCLPP_NCCL_LIB_PATH"))

    def data(r, n, dtype=torch.float32, salt=0):
        gen = torch.Generator().manual_seed(1000 * salt + r)
        return torch.randint(-100, 100, (n,), generator=gen).to(dtype)

    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32):
        for n in (1, 1000, 1 << 20):
            def t(dtype=dtype, n=n):
                x = data(rank, n, dtype, 1).to(dev)
                dist.all_reduce(x)
                want = sum(data(r, n, torch.float64, 1) for r in range(world))
                torch.testing.assert_close(x.double().cpu(), want, rtol=0, atol=0)
            run(f"all_reduce sum {dtype} n={n}", t)

    def ar_max():
        x = data(rank, 4096, salt=2).to(dev)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        want = torch.stack([data(r, 4096, salt=2) for r in range(world)]).max(0).values
        torch.testing.assert_close(x.cpu(), want, rtol=0, atol=0)
    run("all_reduce max f32", ar_max)

    def ag():
        n = 12345
        x = data(rank, n, salt=3).to(dev)
        out = torch.full((world * n,), float("nan"), device=dev)
        dist.all_gather_into_tensor(out, x)
        want = torch.cat([data(r, n, salt=3) for r in range(world)])
        torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)
    run("all_gather_into_tensor f32", ag)

    def ag_u8():
        n = 1000
        x = (data(rank, n, salt=4) % 100).abs().to(torch.uint8).to(dev)
        out = torch.zeros(world * n, dtype=torch.uint8, device=dev)
        dist.all_gather_into_tensor(out, x)
        want = torch.cat([(data(r, n, salt=4) % 100).abs().to(torch.uint8) for r in range(world)])
        assert torch.equal(out.cpu(), want)
    run("all_gather_into_tensor uint8", ag_u8)

    def rs():
        n = 4096
        x = data(rank, world * n, salt=5).to(dev)
        out = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(out, x)
        want = sum(data(r, world * n, salt=5)[rank * n:(rank + 1) * n] for r in range(world))
        torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)
    run("reduce_scatter_tensor f32", rs)

    def bc():
        n = 70000
        x = data(rank, n, salt=6).to(dev)
        dist.broadcast(x, src=world - 1)
        torch.testing.assert_close(x.cpu(), data(world - 1, n, salt=6), rtol=0, atol=0)
    run("broadcast f32", bc)

    def a2a():
        n = 3000
        x = data(rank, world * n, salt=7).to(dev)
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x)
        want = torch.cat([data(r, world * n, salt=7)[rank * n:(rank + 1) * n] for r in range(world)])
        torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)
    run("all_to_all_single f32", a2a)

    def sr():
        n = 5000
        if rank == 0:
            dist.send(data(0, n, salt=8).to(dev), dst=1)
        elif rank == 1:
            y = torch.empty(n, device=dev)
            dist.recv(y, src=0)
            torch.testing.assert_close(y.cpu(), data(0, n, salt=8), rtol=0, atol=0)
        torch.cuda.synchronize()
    if world >= 2:
        if have_fallback:
            run("send/recv (fallback)", sr)
        else:
            report("send/recv", "SKIP-EXPECTED", "(needs MSCCLPP_NCCL_LIB_PATH; not attempted, it would break the communicator)")

    run("barrier", lambda: dist.barrier())

    def graph():
        n = 8192
        x = torch.zeros(n, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):  # warm-up outside the capture (NCCL's rule for graphs)
                x.fill_(1.0)
                dist.all_reduce(x)
        torch.cuda.current_stream().wait_stream(s)
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            dist.all_reduce(x)
        for it in range(5):
            x.copy_(data(rank, n, salt=9 + it).to(dev))
            gr.replay()
            torch.cuda.synchronize()
            want = sum(data(r, n, salt=9 + it) for r in range(world))
            torch.testing.assert_close(x.cpu(), want, rtol=0, atol=0)
    run("all_reduce in a CUDA graph (5 replays)", graph)

    torch.cuda.synchronize()
    failed = [n for n, ok in results if ok is False]
    print(f"[rank {rank}] SUMMARY {len(results) - len(failed)}/{len(results)} ok"
          + (f"; FAILED: {failed}" if failed else ""), flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
