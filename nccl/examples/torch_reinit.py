#!/usr/bin/env python3
"""Process-group re-initialisation: init, all_reduce, destroy, several times in one process.

What a training job does when it recovers or re-shards: `init_process_group`, work,
`destroy_process_group`, and again. Each cycle all-reduces a tensor (a different length every
cycle) and checks it against the exact sum computed on the CPU. Run under torchrun (two ranks
may share one GPU):

    LD_PRELOAD=/path/to/libmscclpp_nccl.so \
    torchrun --nproc_per_node=2 nccl/examples/torch_reinit.py [--eager] [--cycles 3]

    torchrun --nproc_per_node=2 nccl/examples/torch_reinit.py --backend mscclpp [--eager]

`--backend nccl` (default) uses PyTorch's NCCL process group (our library under LD_PRELOAD);
`--backend mscclpp` uses `mscclpp_rs.torch_backend` (`init_process_group("cuda:mscclpp")`,
`mscclpp_rs` must be importable). `--eager` passes `device_id=` to `init_process_group`, so the
communicator is made at init; without it (lazy) it is made at the first collective.

Prints one PASS/FAIL line per cycle and rank; exits non-zero if any cycle failed. A cycle that
hangs for 50 s dumps every thread's stack and exits (faulthandler).
"""
import argparse
import faulthandler
import os
import sys
import traceback

import torch
import torch.distributed as dist


def values(rank, n, cycle, device=None):
    # small integers (< 1000): their sum over up to 16 ranks is exact in float32
    i = torch.arange(n, dtype=torch.int64, device=device)
    return ((i * (rank + 1) + 7 * cycle + rank) % 1000).to(torch.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=("nccl", "mscclpp"), default="nccl")
    ap.add_argument("--eager", action="store_true",
                    help="init_process_group(..., device_id=cuda:local_rank % device_count)")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--count", type=int, default=4099, help="elements in cycle 0 (+1 per cycle)")
    args = ap.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    if args.backend == "mscclpp":
        import mscclpp_rs.torch_backend  # noqa: F401  (registers "mscclpp")
        pg_backend = "cuda:mscclpp"
    else:
        pg_backend = "nccl"
    mode = "eager" if args.eager else "lazy"
    me = os.environ.get("RANK", str(local))

    results = []
    for cycle in range(args.cycles):
        # re-armed every cycle: a hang shows where, then the process exits
        faulthandler.dump_traceback_later(50, exit=True)
        name = f"reinit_{args.backend}_{mode}_cycle{cycle}"
        ok, detail, fatal = False, "", False
        try:
            if args.eager:
                dist.init_process_group(pg_backend, device_id=dev)
            else:
                dist.init_process_group(pg_backend)
            rank, world = dist.get_rank(), dist.get_world_size()
            me = str(rank)
            n = args.count + cycle
            x = values(rank, n, cycle, dev)
            dist.all_reduce(x)
            got = x.cpu()
            want = sum(values(r, n, cycle) for r in range(world))
            bad = int((got != want).sum())
            ok = bad == 0
            if not ok:
                first = int((got != want).nonzero()[0])
                detail = f"{bad} of {n} wrong (first at {first}: got {got[first].item()}, want {want[first].item()})"
        except Exception as e:  # noqa: BLE001
            detail = f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
            fatal = True
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001
            ok = False
            detail = (detail + "; " if detail else "") + f"destroy_process_group: {type(e).__name__}: {str(e)[:200]}"
            traceback.print_exc()
            fatal = True
        print(f"[rank {me}] {'PASS' if ok else 'FAIL'} {name} {detail}".rstrip(), flush=True)
        results.append(ok)
        if fatal:
            break  # the next cycle would start from a broken state
    faulthandler.cancel_dump_traceback_later()
    failed = results.count(False) + (args.cycles - len(results))
    print(f"[rank {me}] SUMMARY {results.count(True)}/{args.cycles} cycles ok", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
