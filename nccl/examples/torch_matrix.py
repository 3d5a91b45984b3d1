#!/usr/bin/env python3
"""PyTorch's distributed features over libmscclpp_nccl.so, one PASS/FAIL line per feature.

Issue 14's matrix: what a PyTorch user runs through the NCCL process group, checked against a CPU
reference on every rank. Run on a GPU node (two ranks may share one GPU):

    LD_PRELOAD=/path/to/libmscclpp_nccl.so MSCCLPP_LOG_LEVEL=warn \
    torchrun --nproc_per_node=2 nccl/examples/torch_matrix.py [--features a,b,...]

`--features` picks and orders them (default: all, in the order below; `fsdp2` first reproduces the
order in which FSDP2 once faulted).
Without MSCCLPP_NCCL_LIB_PATH nothing can fall back to the real NCCL: every feature is native.
Exits non-zero if any feature failed.

`--backend mscclpp` runs the same matrix through the Python package's `torch.distributed`
backend instead (`mscclpp_rs.torch_backend`, `init_process_group("cuda:mscclpp")`, no
`LD_PRELOAD`; `mscclpp_rs` must be importable).
"""
import argparse
import os
import sys
import traceback

import torch
import torch.distributed as dist

RESULTS = []


def report(name, ok, detail=""):
    tag = "PASS" if ok else "FAIL"
    print(f"[rank {dist.get_rank()}] {tag} {name} {detail}".rstrip(), flush=True)
    RESULTS.append((name, ok))


def data(r, n, dtype=torch.float32, salt=0):
    gen = torch.Generator().manual_seed(1000 * salt + r)
    return torch.randint(-8, 8, (n,), generator=gen).to(dtype)


def exact(got, want):
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


class Ctx:
    def __init__(self, dev, rank, world):
        self.dev, self.rank, self.world = dev, rank, world


def f_allreduce_float(c):
    ops = [("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN),
           ("prod", dist.ReduceOp.PRODUCT), ("avg", dist.ReduceOp.AVG)]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for name, op in ops:
            n = 3001
            x = data(c.rank, n, dtype, 1).to(c.dev)
            if name == "prod":
                x = (x.abs() % 2 + 1).to(dtype)  # small factors: exact in every type
            dist.all_reduce(x, op=op)
            ins = [data(r, n, torch.float64, 1) for r in range(c.world)]
            if name == "prod":
                ins = [(t.abs() % 2 + 1) for t in ins]
            st = torch.stack(ins)
            want = {"sum": st.sum(0), "max": st.max(0).values, "min": st.min(0).values,
                    "prod": st.prod(0), "avg": st.sum(0) / c.world}[name]
            torch.testing.assert_close(x.double().cpu(), want.to(dtype).double(),
                                       rtol=1e-2 if name == "avg" else 0, atol=0)


def f_allreduce_wide(c):
    for dtype in (torch.float64, torch.int64, torch.uint8, torch.int8):
        n = 2049
        x = (data(c.rank, n, torch.float64, 2).abs() % 4).to(dtype).to(c.dev)
        dist.all_reduce(x)
        want = sum((data(r, n, torch.float64, 2).abs() % 4) for r in range(c.world)).to(dtype)
        exact(x, want)


def f_pow2_sizes(c):
    # Power-of-two sizes (1 KiB to 4 MiB of float32): the sizes execution plans divide into
    # chunks, so that MSCCLPP_EXECUTION_PLAN_DIR's plans are the ones that serve them.
    for k in range(8, 21, 4):
        n = 1 << k
        x = data(c.rank, n, salt=9).to(c.dev)
        dist.all_reduce(x)
        exact(x, sum(data(r, n, salt=9) for r in range(c.world)))
        out = torch.full((c.world * n,), float("nan"), device=c.dev)
        dist.all_gather_into_tensor(out, x)
        exact(out, torch.cat([sum(data(r, n, salt=9) for r in range(c.world))] * c.world))


def pattern(r, n, dev, dtype, salt=0):
    # Small integers made on the device (no host copy of a tensor this large): exact in every
    # type the sums are checked in.
    i = torch.arange(n, device=dev, dtype=torch.int64)
    return ((i * 7 + r * 3 + salt) % 16 - 8).to(dtype)


def f_segments(c):
    # Tensors larger than one segment of the caching allocator, and views that start inside
    # one: under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True such a tensor spans several
    # cuMemMap mappings (one virtual range), which NCCL serves.
    n = 128 << 20  # 256 MiB of bfloat16
    x = pattern(c.rank, n, c.dev, torch.bfloat16)
    dist.all_reduce(x)
    want = sum(pattern(r, n, c.dev, torch.float32) for r in range(c.world))
    assert torch.equal(x.float(), want), "all_reduce of 256 MiB of bfloat16"
    del x, want
    base = torch.empty(n + 4099, device=c.dev, dtype=torch.float32)
    v = base[4099:]
    v.copy_(pattern(c.rank, n, c.dev, torch.float32, 1))
    dist.all_reduce(v)
    want = sum(pattern(r, n, c.dev, torch.float32, 1) for r in range(c.world))
    assert torch.equal(v, want), "all_reduce of a view starting inside a segment"
    del base, v, want
    m = 32 << 20
    x = pattern(c.rank, m, c.dev, torch.float32, 2)
    out = torch.full((c.world * m,), float("nan"), device=c.dev)
    dist.all_gather_into_tensor(out, x)
    want = torch.cat([pattern(r, m, c.dev, torch.float32, 2) for r in range(c.world)])
    assert torch.equal(out, want), "all_gather_into_tensor of 128 MiB per rank"
    del x, out, want
    x = pattern(c.rank, c.world * m, c.dev, torch.float32, 3)
    out = torch.full((m,), float("nan"), device=c.dev)
    dist.reduce_scatter_tensor(out, x)
    full = sum(pattern(r, c.world * m, c.dev, torch.float32, 3) for r in range(c.world))
    assert torch.equal(out, full[c.rank * m:(c.rank + 1) * m]), "reduce_scatter_tensor"
    del x, out, full
    torch.cuda.empty_cache()


def f_huge(c):
    # 2^31 + 3 elements of bfloat16 (4 GiB a rank): counts past 32 bits, over many segments.
    # Filled and checked in chunks (a whole int64 index would be 16 GiB).
    n, step = (1 << 31) + 3, 1 << 27

    def chunk(r, s, e):
        i = torch.arange(s, e, device=c.dev, dtype=torch.int64)
        return (i * 7 + r * 3 + 4) % 16 - 8

    x = torch.empty(n, device=c.dev, dtype=torch.bfloat16)
    for s in range(0, n, step):
        x[s:min(n, s + step)] = chunk(c.rank, s, min(n, s + step)).to(torch.bfloat16)
    dist.all_reduce(x)
    for s in range(0, n, step):
        e = min(n, s + step)
        want = sum(chunk(r, s, e) for r in range(c.world)).float()
        assert torch.equal(x[s:e].float(), want), f"all_reduce of 2^31+3 bfloat16: [{s}, {e})"
    del x
    torch.cuda.empty_cache()


def f_allgather(c):
    n = 12345
    x = data(c.rank, n, salt=3).to(c.dev)
    out = torch.full((c.world * n,), float("nan"), device=c.dev)
    dist.all_gather_into_tensor(out, x)
    exact(out, torch.cat([data(r, n, salt=3) for r in range(c.world)]))
    outs = [torch.empty(n, device=c.dev) for _ in range(c.world)]
    dist.all_gather(outs, x)
    for r in range(c.world):
        exact(outs[r], data(r, n, salt=3))


def f_reducescatter(c):
    n = 4096
    x = data(c.rank, c.world * n, salt=5).to(c.dev)
    out = torch.empty(n, device=c.dev)
    dist.reduce_scatter_tensor(out, x)
    exact(out, sum(data(r, c.world * n, salt=5)[c.rank * n:(c.rank + 1) * n] for r in range(c.world)))


def f_reduce(c):
    n = 5000
    x = data(c.rank, n, salt=6).to(c.dev)
    dist.reduce(x, dst=c.world - 1)
    if c.rank == c.world - 1:
        exact(x, sum(data(r, n, salt=6) for r in range(c.world)))


def f_broadcast(c):
    n = 70000
    x = data(c.rank, n, salt=7).to(c.dev)
    dist.broadcast(x, src=c.world - 1)
    exact(x, data(c.world - 1, n, salt=7))


def f_alltoall(c):
    n = 3000
    x = data(c.rank, c.world * n, salt=8).to(c.dev)
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    exact(out, torch.cat([data(r, c.world * n, salt=8)[c.rank * n:(c.rank + 1) * n] for r in range(c.world)]))


def f_alltoall_uneven(c):
    # rank r sends (r + p + 1) * 100 elements to rank p
    sizes = lambda r: [(r + p + 1) * 100 for p in range(c.world)]  # noqa: E731
    x = data(c.rank, sum(sizes(c.rank)), salt=9).to(c.dev)
    in_split = sizes(c.rank)
    out_split = [sizes(r)[c.rank] for r in range(c.world)]
    out = torch.empty(sum(out_split), device=c.dev)
    dist.all_to_all_single(out, x, output_split_sizes=out_split, input_split_sizes=in_split)
    want = []
    for r in range(c.world):
        s = sizes(r)
        start = sum(s[:c.rank])
        want.append(data(r, sum(s), salt=9)[start:start + s[c.rank]])
    exact(out, torch.cat(want))


def f_sendrecv(c):
    n = 5000
    nxt, prv = (c.rank + 1) % c.world, (c.rank - 1) % c.world
    if c.rank % 2 == 0:
        dist.send(data(c.rank, n, salt=10).to(c.dev), dst=nxt)
        y = torch.empty(n, device=c.dev)
        dist.recv(y, src=prv)
    else:
        y = torch.empty(n, device=c.dev)
        dist.recv(y, src=prv)
        dist.send(data(c.rank, n, salt=10).to(c.dev), dst=nxt)
    exact(y, data(prv, n, salt=10))


def f_batch_isend_irecv(c):
    n = 7000
    ys = {p: torch.empty(n, device=c.dev) for p in range(c.world) if p != c.rank}
    ops = []
    for p in range(c.world):
        if p != c.rank:
            ops.append(dist.P2POp(dist.isend, data(c.rank * 10 + p, n, salt=11).to(c.dev), p))
            ops.append(dist.P2POp(dist.irecv, ys[p], p))
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for p, y in ys.items():
        exact(y, data(p * 10 + c.rank, n, salt=11))


def f_gather_scatter(c):
    n = 999
    x = data(c.rank, n, salt=12).to(c.dev)
    root = 0
    outs = [torch.empty(n, device=c.dev) for _ in range(c.world)] if c.rank == root else None
    dist.gather(x, outs, dst=root)
    if c.rank == root:
        for r in range(c.world):
            exact(outs[r], data(r, n, salt=12))
    y = torch.empty(n, device=c.dev)
    ins = [data(100 + r, n, salt=12).to(c.dev) for r in range(c.world)] if c.rank == root else None
    dist.scatter(y, ins, src=root)
    exact(y, data(100 + c.rank, n, salt=12))


def f_objects(c):
    objs = [None] * c.world
    dist.all_gather_object(objs, {"rank": c.rank, "s": "x" * (c.rank + 3)})
    assert objs == [{"rank": r, "s": "x" * (r + 3)} for r in range(c.world)], objs
    lst = [{"k": [1, 2, 3]}] if c.rank == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [{"k": [1, 2, 3]}], lst


def f_new_group(c):
    ranks = list(range(0, c.world, 2)) if c.world > 2 else list(range(c.world))
    g = dist.new_group(ranks)
    if c.rank in ranks:
        x = data(c.rank, 777, salt=13).to(c.dev)
        dist.all_reduce(x, group=g)
        exact(x, sum(data(r, 777, salt=13) for r in ranks))
    dist.barrier()


def f_split_group(c):
    if not hasattr(dist, "split_group"):
        raise RuntimeError("this PyTorch has no dist.split_group")
    halves = [list(range(0, c.world, 2)), list(range(1, c.world, 2))] if c.world > 2 else [list(range(c.world))]
    g = dist.split_group(split_ranks=halves)
    mine = next(h for h in halves if c.rank in h)
    x = data(c.rank, 555, salt=14).to(c.dev)
    dist.all_reduce(x, group=g)
    exact(x, sum(data(r, 555, salt=14) for r in mine))


def f_coalescing(c):
    from torch.distributed.distributed_c10d import _coalescing_manager
    xs = [data(c.rank, 100 * (i + 1), salt=15 + i).to(c.dev) for i in range(3)]
    with _coalescing_manager(async_ops=True) as cm:
        for x in xs:
            dist.all_reduce(x)
    cm.wait()
    for i, x in enumerate(xs):
        exact(x, sum(data(r, 100 * (i + 1), salt=15 + i) for r in range(c.world)))


def f_graphs(c):
    n = 8192
    x = torch.zeros(n, device=c.dev)
    out = torch.zeros(c.world * n, device=c.dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            dist.all_reduce(x)
            dist.all_gather_into_tensor(out, x)
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        dist.all_reduce(x)
        dist.all_gather_into_tensor(out, x)
    for it in range(4):
        x.copy_(data(c.rank, n, salt=20 + it).to(c.dev))
        gr.replay()
        torch.cuda.synchronize()
        want = sum(data(r, n, salt=20 + it) for r in range(c.world))
        exact(x, want)
        exact(out, want.repeat(c.world))


def f_functional(c):
    import torch.distributed._functional_collectives as fc
    x = data(c.rank, 1024, salt=25).to(c.dev)
    y = fc.all_reduce(x, "sum", dist.group.WORLD)
    exact(y, sum(data(r, 1024, salt=25) for r in range(c.world)))
    z = fc.all_gather_tensor(x, 0, dist.group.WORLD)
    exact(z, torch.cat([data(r, 1024, salt=25) for r in range(c.world)]))


def model(c):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(c.dev)


def train(m, c, steps=5):
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    losses = []
    for s in range(steps):
        g = torch.Generator().manual_seed(100 * s + c.rank)
        x = torch.randn(32, 64, generator=g).to(c.dev)
        y = torch.randn(32, 8, generator=g).to(c.dev)
        loss = torch.nn.functional.mse_loss(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def reference_params(c, steps=5):
    # Data parallel by hand: the mean of every rank's gradient, computed here from all ranks' data.
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(c.dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for s in range(steps):
        opt.zero_grad()
        for r in range(c.world):
            g = torch.Generator().manual_seed(100 * s + r)
            x = torch.randn(32, 64, generator=g).to(c.dev)
            y = torch.randn(32, 8, generator=g).to(c.dev)
            (torch.nn.functional.mse_loss(m(x), y) / c.world).backward()
        opt.step()
    return [p.detach().cpu() for p in m.parameters()]


def f_ddp(c):
    from torch.nn.parallel import DistributedDataParallel as DDP
    m = DDP(model(c), device_ids=[c.dev.index])
    train(m, c)
    for p, q in zip(m.module.parameters(), reference_params(c)):
        torch.testing.assert_close(p.detach().cpu(), q, rtol=1e-4, atol=1e-5)


def f_fsdp2(c):
    from torch.distributed.fsdp import fully_shard
    m = model(c)
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(m)
    train(m, c)
    full = [p.full_tensor().detach().cpu() for p in m.parameters()]
    for p, q in zip(full, reference_params(c)):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def f_barrier(c):
    dist.barrier()


FEATURES = {
    "allreduce_float": f_allreduce_float, "allreduce_wide": f_allreduce_wide,
    "allgather": f_allgather, "reducescatter": f_reducescatter, "reduce": f_reduce,
    "broadcast": f_broadcast, "alltoall": f_alltoall, "alltoall_uneven": f_alltoall_uneven,
    "sendrecv": f_sendrecv, "batch_isend_irecv": f_batch_isend_irecv,
    "gather_scatter": f_gather_scatter, "objects": f_objects, "new_group": f_new_group,
    "split_group": f_split_group, "coalescing": f_coalescing, "graphs": f_graphs,
    "functional": f_functional, "ddp": f_ddp, "fsdp2": f_fsdp2, "barrier": f_barrier,
    "pow2_sizes": f_pow2_sizes, "segments": f_segments,
}
# Opt-in (--features huge): 4 GiB a rank.
OPT_IN = {"huge": f_huge}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--features", default=",".join(FEATURES))
    ap.add_argument("--backend", choices=("nccl", "mscclpp"), default="nccl",
                    help="nccl: the NCCL process group (our library under LD_PRELOAD); "
                    "mscclpp: mscclpp_rs's torch.distributed backend")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    if args.backend == "mscclpp":
        import mscclpp_rs.torch_backend  # noqa: F401  (registers "mscclpp")
        dist.init_process_group("cuda:mscclpp")
    else:
        dist.init_process_group("nccl", device_id=dev)
    if dist.get_rank() == 0:
        print(f"# backend {dist.get_backend()}, torch {torch.__version__}", flush=True)
    c = Ctx(dev, dist.get_rank(), dist.get_world_size())
    for name in args.features.split(","):
        try:
            (FEATURES.get(name) or OPT_IN[name])(c)
            torch.cuda.synchronize()
            report(name, True)
        except Exception as e:  # noqa: BLE001
            report(name, False, f"{type(e).__name__}: {str(e)[:300]}")
            traceback.print_exc()
    failed = [n for n, ok in RESULTS if not ok]
    print(f"[rank {c.rank}] SUMMARY {len(RESULTS) - len(failed)}/{len(RESULTS)} ok"
          + (f"; FAILED: {failed}" if failed else ""), flush=True)
    try:
        dist.destroy_process_group()
    finally:
        sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
