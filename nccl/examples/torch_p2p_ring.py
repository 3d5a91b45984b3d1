#!/usr/bin/env python3
"""Point-to-point through PyTorch: a batch_isend_irecv ring and a pairwise all-to-all.

Each rank sends to the next rank and receives from the previous one in one
`batch_isend_irecv` (float32, 33, 10000, 65536 and 1 Mi elements), then exchanges a distinct
tensor with every other rank in one batch (a pairwise all-to-all). Every received tensor is
checked exactly. Run under torchrun (two ranks may share one GPU):

    LD_PRELOAD=/path/to/libmscclpp_nccl.so torchrun --nproc_per_node=2 nccl/examples/torch_p2p_ring.py
    torchrun --nproc_per_node=2 nccl/examples/torch_p2p_ring.py --backend mscclpp

`--backend nccl` (default): PyTorch's NCCL process group (our library under LD_PRELOAD),
initialised eagerly (`device_id=`); `--backend mscclpp`: `mscclpp_rs.torch_backend`
(`init_process_group("cuda:mscclpp")`). Prints one PASS/FAIL line per case and rank; exits
non-zero if any failed. A case that hangs for 50 s dumps every thread's stack and exits.
"""
import argparse
import faulthandler
import os
import sys
import traceback

import torch
import torch.distributed as dist

RING_COUNTS = (33, 10000, 65536, 1 << 20)
PAIR_COUNTS = (33, 4096, 65536)


def values(src, dst, n, salt, device=None):
    # distinct per (sender, receiver, size), below 2^24: exact in float32
    i = torch.arange(n, dtype=torch.int64, device=device)
    return ((i * 3 + src * 1009 + dst * 17 + salt * 101) % 65521).to(torch.float32)


def check(got, want, what):
    got = got.cpu()
    bad = got != want
    if bool(bad.any()):
        first = int(bad.nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {want.numel()} wrong (first at {first}: "
                             f"got {got[first].item()}, want {want[first].item()})")


def ring(rank, world, dev, n):
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    x = values(rank, nxt, n, 1, dev)
    y = torch.full((n,), float("nan"), device=dev)
    ops = [dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, y, prv)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    torch.cuda.synchronize()
    check(y, values(prv, rank, n, 1), f"from rank {prv}")


def pairwise(rank, world, dev, n):
    sends = {p: values(rank, p, n, 2, dev) for p in range(world) if p != rank}
    recvs = {p: torch.full((n,), float("nan"), device=dev) for p in range(world) if p != rank}
    ops = []
    for p in range(world):
        if p == rank:
            continue
        ops.append(dist.P2POp(dist.isend, sends[p], p))
        ops.append(dist.P2POp(dist.irecv, recvs[p], p))
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    torch.cuda.synchronize()
    for p, y in recvs.items():
        check(y, values(p, rank, n, 2), f"from rank {p}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=("nccl", "mscclpp"), default="nccl")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    faulthandler.dump_traceback_later(50, exit=True)
    if args.backend == "mscclpp":
        import mscclpp_rs.torch_backend  # noqa: F401  (registers "mscclpp")
        dist.init_process_group("cuda:mscclpp")
    else:
        dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    cases = [(f"ring_{n}", ring, n) for n in RING_COUNTS]
    cases += [(f"pairwise_alltoall_{n}", pairwise, n) for n in PAIR_COUNTS]
    results = []
    for name, fn, n in cases:
        faulthandler.dump_traceback_later(50, exit=True)
        try:
            if world < 2:
                raise RuntimeError("needs at least 2 ranks")
            fn(rank, world, dev, n)
            ok, detail = True, ""
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
        print(f"[rank {rank}] {'PASS' if ok else 'FAIL'} {name} {detail}".rstrip(), flush=True)
        results.append((name, ok))
    faulthandler.dump_traceback_later(50, exit=True)
    failed = [name for name, ok in results if not ok]
    print(f"[rank {rank}] SUMMARY {len(results) - len(failed)}/{len(results)} ok"
          + (f"; FAILED: {failed}" if failed else ""), flush=True)
    try:
        dist.destroy_process_group()
    finally:
        faulthandler.cancel_dump_traceback_later()
        sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
