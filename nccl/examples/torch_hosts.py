#!/usr/bin/env python3
"""PyTorch's NCCL process group across simulated hosts, as DeepEP's internode test sets it up.

`HOSTS` node processes, each spawning `PER_HOST` ranks (rank = host * PER_HOST + local rank,
every rank on `cuda:(local rank % device count)`), each node a simulated host
(`MSCCLPP_HOSTID`), so that the communicator spans hosts and its collectives take the
multi-host (hierarchical) path. Each rank: `init_process_group("nccl", device_id=...)` (the
communicator made at init), `new_group` of every rank (a split), then on that group broadcasts
of several types and lengths (odd byte counts included) from rank 0, each synchronised and
checked, PyTorch's `broadcast_object_list` (an int64 size, then the pickled bytes), an
all-reduce and an all-gather, each checked against the exact values computed on the CPU:

    LD_PRELOAD=/path/to/libmscclpp_nccl.so \
    python3 nccl/examples/torch_hosts.py --hosts 2 --per-host 8 [--limit 120] [--port 29533]

Every step prints `[rN] <seconds> <step> ok=...`; a rank that has not finished after `--limit`
seconds prints every thread's Python stack and exits (faulthandler).
Exits non-zero if any rank failed or hung. Prints `skip: <why>` and exits 0 without PyTorch or
a GPU.
"""
import argparse
import faulthandler
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError as e:  # pragma: no cover - the GPU machine has torch
    print(f"skip: PyTorch is not importable ({e})", flush=True)
    sys.exit(0)


def rank_main(local, node, a):
    rank = node * a.per_host + local
    world = a.hosts * a.per_host
    os.environ["MSCCLPP_HOSTID"] = f"torch-hosts-{a.port}-{node}"
    # A rank still running after the limit prints every thread's stack and exits (from
    # faulthandler's own thread: it needs no GIL).
    faulthandler.dump_traceback_later(a.limit, exit=True)
    t0 = time.time()
    failed = []

    def stamp(what, ok=True):
        if not ok:
            failed.append(what)
        print(f"[r{rank}] {time.time() - t0:7.2f}s {what} ok={ok}", flush=True)

    dev = local % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{a.port}", world_size=world,
                            rank=rank, device_id=torch.device("cuda", dev))
    stamp("init_process_group")
    g = dist.new_group(list(range(world)))
    stamp("new_group")
    for name, dt, n in [("int64", torch.int64, 1), ("uint8", torch.uint8, 8),
                        ("uint8", torch.uint8, 44), ("uint8", torch.uint8, 48),
                        ("float32", torch.float32, 11), ("uint8", torch.uint8, 44),
                        ("bfloat16", torch.bfloat16, 4099)]:
        want = (torch.arange(n) % 97).to(dt)
        t = want.cuda() if rank == 0 else torch.full((n,), 99, dtype=dt, device="cuda")
        dist.broadcast(t, src=0, group=g)
        torch.cuda.synchronize()
        stamp(f"broadcast {name} x{n}", bool((t.cpu() == want).all()))
    box = [f"object-of-rank-0-{a.port}" if rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=g)
    stamp("broadcast_object_list", box[0] == f"object-of-rank-0-{a.port}")
    x = torch.full((1000,), float(rank + 1), device="cuda")
    dist.all_reduce(x, group=g)
    torch.cuda.synchronize()
    stamp("all_reduce", bool((x.cpu() == world * (world + 1) / 2).all()))
    parts = [torch.empty(3, device="cuda") for _ in range(world)]
    dist.all_gather(parts, torch.full((3,), float(rank), device="cuda"), group=g)
    torch.cuda.synchronize()
    stamp("all_gather", all(bool((p.cpu() == r).all()) for r, p in enumerate(parts)))
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()
    if failed:
        raise SystemExit(f"rank {rank}: wrong results in {failed}")


def node_main(node, a):
    mp.spawn(rank_main, args=(node, a), nprocs=a.per_host)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=8)
    ap.add_argument("--limit", type=float, default=120.0,
                    help="seconds after which a rank still running prints its stacks and exits")
    ap.add_argument("--port", type=int, default=29533)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("skip: no GPU", flush=True)
        return 0
    ctx = mp.get_context("spawn")
    nodes = [ctx.Process(target=node_main, args=(n, a)) for n in range(a.hosts)]
    for p in nodes:
        p.start()
    for p in nodes:
        p.join()
    codes = [p.exitcode for p in nodes]
    print(f"torch_hosts: {a.hosts} hosts of {a.per_host}: node exit codes {codes}", flush=True)
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
