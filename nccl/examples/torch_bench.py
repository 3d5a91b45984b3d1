#!/usr/bin/env python3
"""Time per torch.distributed.all_reduce, 1 KiB to 1 GiB, bf16: eager calls and calls replayed
from a CUDA graph. Run it twice, with and without LD_PRELOAD=libmscclpp_nccl.so:

    torchrun --nproc_per_node=2 nccl/examples/torch_bench.py
    LD_PRELOAD=.../libmscclpp_nccl.so torchrun --nproc_per_node=2 nccl/examples/torch_bench.py

Rank 0 prints one line per size: bytes, eager µs, graph µs (and checks the result once).
"""
import os

import torch
import torch.distributed as dist


def main():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    size = 1024
    while size <= 1 << 30:
        n = size // 2
        x = torch.full((n,), float(rank + 1), dtype=torch.bfloat16, device=dev)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        ok = bool((x == float(world * (world + 1) // 2)).all())
        iters = 20 if size <= 64 << 20 else 5
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            dist.all_reduce(x)
        e.record()
        torch.cuda.synchronize()
        eager = s.elapsed_time(e) * 1e3 / iters
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            with torch.cuda.graph(g, stream=stream):
                for _ in range(iters):
                    dist.all_reduce(x)
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        dist.barrier()
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        graph = s.elapsed_time(e) * 1e3 / iters
        if rank == 0:
            print(f"{size:>12} eager_us {eager:10.2f} graph_us {graph:10.2f} {'ok' if ok else 'WRONG'}", flush=True)
        size *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
