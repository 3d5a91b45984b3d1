"""``python -m mscclpp_rs.bench``: all-reduce and all-gather of torch tensors through mscclpp_rs
beside torch.distributed with NCCL, in the same run, on the same tensors and stream.

Standalone it spawns one process per GPU (at least 2 are needed: NCCL refuses two ranks on one
GPU); under torchrun each process is a rank. Needs torch with CUDA (or ROCm); prints why it
skips otherwise. Every size is checked once before it is timed.

    python -m mscclpp_rs.bench                     # 1 KiB .. 1 GiB, all GPUs
    python -m mscclpp_rs.bench -b 1M -e 64M -n 50  # a range, 50 timed iterations
    python -m mscclpp_rs.bench --ranks 2 --baseline none   # ours only, ranks may share a GPU

``--baseline none`` times ours alone (no torch.distributed), so that ranks may share a GPU:
the path and the checks run, but ranks that share a GPU take turns on it, so the times say
nothing about the speed.
"""

import argparse
import os
import socket
import sys

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size(s):
    s = s.strip().upper().rstrip("B").rstrip("I")
    unit = s[-1] if s and s[-1] in UNITS else ""
    try:
        return int(float(s[: len(s) - len(unit)]) * UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {s!r}: expected a number with K, M or G")


def _fmt(n):
    for u in ("G", "M", "K"):
        if n >= UNITS[u] and n % UNITS[u] == 0:
            return f"{n // UNITS[u]}{u}"
    return str(n)


def _why_not(baseline):
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA/ROCm device"
    if baseline == "nccl" and not torch.distributed.is_nccl_available():
        return "torch.distributed has no NCCL backend"
    return None


def _time(fn, iters, warmup):
    import torch

    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters  # microseconds


def _rank_main(args):
    import torch
    import torch.distributed as dist

    import mscclpp_rs

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    nccl = args.baseline == "nccl"
    if nccl:
        # torch.distributed loads the real NCCL, which reads only NCCL_NVLS_ENABLE: refuse where
        # multicast is disabled for us but not for it (never create multicast objects there).
        mscclpp_rs._native.check_nccl_nvls("python -m mscclpp_rs.bench")
        dist.init_process_group("nccl", device_id=dev)
    comm = mscclpp_rs.Communicator.from_env(device=dev.index)
    if rank == 0:
        beside = (f"beside torch {torch.__version__} NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
                  if nccl else f"alone (--baseline none; {torch.cuda.device_count()} GPU(s) for "
                  f"{size} ranks: where ranks share a GPU the times are not speeds)")
        print(f"# mscclpp_rs {mscclpp_rs.__version__} ({comm.backend}, {comm.device_name}) {beside}; "
              f"{size} ranks, float32, {args.iters} iterations after {args.warmup}")
        print(f"{'collective':>10} {'size':>6} {'count':>11} {'ours(us)':>10} {'busbw':>7} "
              f"{'nccl(us)':>10} {'busbw':>7} {'ours/nccl':>9}")
    def baseline(fn):
        return _time(fn, args.iters, args.warmup) if nccl else None

    ops = [o.strip() for o in args.ops.split(",")]
    nbytes = args.min
    while nbytes <= args.max:
        count = max(1, nbytes // 4)
        for op in ops:
            if op == "allreduce":
                x = torch.full((count,), float(rank + 1), device=dev)
                comm.all_reduce(x)
                torch.cuda.synchronize()
                want = size * (size + 1) / 2
                wrong = int((x != want).sum())
                ours = _time(lambda: comm.all_reduce(x), args.iters, args.warmup)
                theirs = baseline(lambda: dist.all_reduce(x))
                factor = 2 * (size - 1) / size
                moved = count * 4
            elif op == "allgather":
                x = torch.full((count,), float(rank + 1), device=dev)
                out = torch.zeros(count * size, device=dev)
                comm.all_gather(out, x)
                torch.cuda.synchronize()
                want = torch.arange(1, size + 1, device=dev, dtype=torch.float32).repeat_interleave(count)
                wrong = int((out != want).sum())
                ours = _time(lambda: comm.all_gather(out, x), args.iters, args.warmup)
                theirs = baseline(lambda: dist.all_gather_into_tensor(out, x))
                factor = (size - 1) / size
                moved = count * 4 * size
            else:
                raise SystemExit(f"--ops: unknown collective {op!r} (allreduce, allgather)")
            wrong_all = torch.tensor([float(wrong)], device=dev)
            (dist.all_reduce if nccl else comm.all_reduce)(wrong_all)
            if rank == 0:
                bw = lambda us: moved * factor / us / 1e3  # noqa: E731  GB/s
                cols = (f"{theirs:>10.2f} {bw(theirs):>7.1f} {ours / theirs:>9.2f}" if nccl
                        else f"{'-':>10} {'-':>7} {'-':>9}")
                print(f"{op:>10} {_fmt(count * 4):>6} {count:>11} {ours:>10.2f} {bw(ours):>7.1f} "
                      + cols + (f"  #wrong {int(wrong_all.item())}" if wrong_all.item() else ""),
                      flush=True)
            del x
        nbytes *= args.factor
    comm.barrier()
    comm.close()
    if nccl:
        dist.destroy_process_group()


def _spawned(local, size, port, argv):
    os.environ.update(RANK=str(local), LOCAL_RANK=str(local), WORLD_SIZE=str(size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _rank_main(_parser().parse_args(argv))


def _parser():
    p = argparse.ArgumentParser(prog="python -m mscclpp_rs.bench", description=__doc__.split("\n")[0])
    p.add_argument("-b", "--min", type=_size, default=1 << 10, help="smallest size (default 1K)")
    p.add_argument("-e", "--max", type=_size, default=1 << 30, help="largest size (default 1G)")
    p.add_argument("-f", "--factor", type=int, default=2, help="size step factor (default 2)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations (default 20)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="warm-up iterations (default 5)")
    p.add_argument("--ops", default="allreduce,allgather", help="allreduce,allgather")
    p.add_argument("--baseline", choices=("nccl", "none"), default="nccl",
                   help="nccl: torch.distributed with NCCL beside ours (default); none: ours alone")
    p.add_argument("--ranks", type=int, default=0,
                   help="processes to spawn (default: one per GPU); more than the GPUs needs "
                   "--baseline none (NCCL takes one GPU per rank)")
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    why = _why_not(args.baseline)
    if why:
        print(f"mscclpp_rs.bench: skipped: {why} (the benchmark compares against NCCL on GPUs)")
        return 0
    if "RANK" in os.environ:
        _rank_main(args)
        return 0
    import torch
    import torch.multiprocessing as tmp

    gpus = torch.cuda.device_count()
    n = args.ranks or gpus
    if args.ranks and args.ranks < 2:
        raise SystemExit(f"--ranks {args.ranks}: the benchmark needs at least 2 ranks")
    if args.baseline == "nccl" and n > gpus:
        raise SystemExit(f"--ranks {n} on {gpus} GPU(s): NCCL takes one GPU per rank; "
                         "add --baseline none to time ours alone")
    if n < 2:
        print(f"mscclpp_rs.bench: skipped: {gpus} GPU(s); NCCL needs a GPU per rank and the "
              "benchmark at least 2 ranks (--ranks 2 --baseline none runs ours alone)")
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp.spawn(_spawned, args=(n, port, argv), nprocs=n, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
