"""Rank processes of ``test_torch_backend.py``: each initialises ``torch.distributed`` with the
``mscclpp`` backend and runs PyTorch's own collective API and DDP against references computed
locally (every rank generates every rank's input from the same seeds)."""

import os
import traceback

DEADLINE_S = float(os.environ.get("MSCCLPP_PYTEST_DEADLINE", "120"))


def _inputs(torch, case, size, shape, dtype, device):
    out = []
    for r in range(size):
        g = torch.Generator().manual_seed(1000 * case + r)
        x = torch.randn(shape, generator=g, dtype=torch.float32)
        out.append(x.to(dtype).to(device))
    return out


def _close(torch, got, want, what, dtype):
    tol = 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5
    got, want = got.double().cpu(), want.double().cpu()
    if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol):
        bad = (got - want).abs().max().item() if got.shape == want.shape else "shape"
        raise AssertionError(f"{what}: wrong result (max error {bad})")


def checks(torch, dist, rank, size, device):
    """The cases; raises on the first wrong result."""
    case = 0
    for dtype in (torch.float32, torch.bfloat16):
        for n in (1, 1000, (1 << 16) + 3):
            for op, ref in (
                (dist.ReduceOp.SUM, lambda xs: sum(x.double() for x in xs)),
                (dist.ReduceOp.MAX, lambda xs: torch.stack([x.double() for x in xs]).amax(0)),
                (dist.ReduceOp.AVG, lambda xs: sum(x.double() for x in xs) / len(xs)),
            ):
                case += 1
                xs = _inputs(torch, case, size, (n,), dtype, device)
                t = xs[rank].clone()
                dist.all_reduce(t, op=op)
                _close(torch, t, ref(xs).to(dtype), f"all_reduce {dtype} n={n} {op}", dtype)
            case += 1
            xs = _inputs(torch, case, size, (n,), dtype, device)
            out = torch.full((size * n,), float("nan"), dtype=dtype, device=device)
            dist.all_gather_into_tensor(out, xs[rank])
            _close(torch, out, torch.cat(xs), f"all_gather_into_tensor {dtype} n={n}", dtype)
            outs = [torch.full((n,), float("nan"), dtype=dtype, device=device) for _ in range(size)]
            dist.all_gather(outs, xs[rank])
            _close(torch, torch.cat(outs), torch.cat(xs), f"all_gather {dtype} n={n}", dtype)
            case += 1
            xs = _inputs(torch, case, size, (size * n,), dtype, device)
            out = torch.full((n,), float("nan"), dtype=dtype, device=device)
            dist.reduce_scatter_tensor(out, xs[rank])
            want = sum(x.double() for x in xs)[rank * n : (rank + 1) * n].to(dtype)
            _close(torch, out, want, f"reduce_scatter_tensor {dtype} n={n}", dtype)
            for root in range(size):
                case += 1
                xs = _inputs(torch, case, size, (n,), dtype, device)
                t = xs[rank].clone() if rank == root else torch.full_like(xs[0], float("nan"))
                dist.broadcast(t, src=root)
                _close(torch, t, xs[root], f"broadcast {dtype} n={n} root={root}", dtype)
    # reduce, gather and scatter to and from each root (non-roots' reduce input left as it was).
    for n in (1, 1001):
        for root in range(size):
            case += 1
            xs = _inputs(torch, case, size, (n,), torch.float32, device)
            t = xs[rank].clone()
            dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
            want = torch.stack(xs).amax(0) if rank == root else xs[rank]
            _close(torch, t, want, f"reduce n={n} root={root}", torch.float32)
            case += 1
            xs = _inputs(torch, case, size, (n,), torch.float32, device)
            outs = [torch.full_like(xs[0], float("nan")) for _ in range(size)] if rank == root else None
            dist.gather(xs[rank], outs, dst=root)
            if rank == root:
                _close(torch, torch.cat(outs), torch.cat(xs), f"gather n={n} root={root}", torch.float32)
            case += 1
            xs = _inputs(torch, case, size, (n,), torch.float32, device)
            got = torch.full_like(xs[0], float("nan"))
            dist.scatter(got, xs if rank == root else None, src=root)
            _close(torch, got, xs[rank], f"scatter n={n} root={root}", torch.float32)
    # all_to_all_single, equal and uneven parts (rank r sends r + p + 1 rows to rank p).
    case += 1
    xs = _inputs(torch, case, size, (size * 4, 3), torch.float32, device)
    out = torch.full_like(xs[0], float("nan"))
    dist.all_to_all_single(out, xs[rank])
    want = torch.cat([xs[p][rank * 4 : (rank + 1) * 4] for p in range(size)])
    _close(torch, out, want, "all_to_all_single", torch.float32)
    rows = lambda s, d: s + d + 1  # noqa: E731
    case += 1
    xs = [
        x[: sum(rows(r, p) for p in range(size))]
        for r, x in enumerate(_inputs(torch, case, size, (64, 3), torch.float32, device))
    ]
    in_splits = [rows(rank, p) for p in range(size)]
    out_splits = [rows(p, rank) for p in range(size)]
    out = torch.full((sum(out_splits), 3), float("nan"), device=device)
    dist.all_to_all_single(out, xs[rank], out_splits, in_splits)
    parts = []
    for p in range(size):
        start = sum(rows(p, q) for q in range(rank))
        parts.append(xs[p][start : start + rows(p, rank)])
    _close(torch, out, torch.cat(parts), "all_to_all_single uneven", torch.float32)
    # all_to_all with lists: equal parts, then uneven ones (rank r sends r + 2p + 1 elements to p).
    case += 1
    xs = _inputs(torch, case, size, (size * 5,), torch.float32, device)
    outs = [torch.full((5,), float("nan"), device=device) for _ in range(size)]
    dist.all_to_all(outs, list(xs[rank].chunk(size)))
    want = torch.cat([xs[p][rank * 5 : (rank + 1) * 5] for p in range(size)])
    _close(torch, torch.cat(outs), want, "all_to_all", torch.float32)
    cnt = lambda s, d: s + 2 * d + 1  # noqa: E731
    case += 1
    xs = _inputs(torch, case, size, (64,), torch.float32, device)
    ins = list(xs[rank][: sum(cnt(rank, p) for p in range(size))].split([cnt(rank, p) for p in range(size)]))
    outs = [torch.full((cnt(p, rank),), float("nan"), device=device) for p in range(size)]
    dist.all_to_all(outs, ins)
    want = []
    for p in range(size):
        start = sum(cnt(p, q) for q in range(rank))
        want.append(xs[p][start : start + cnt(p, rank)])
    _close(torch, torch.cat(outs), torch.cat(want), "all_to_all uneven", torch.float32)
    # PREMUL_SUM (FSDP's gradient pre-division): every rank scales its own input by its own
    # factor, a float or a one-element tensor, then the products are summed; the input of
    # reduce_scatter_tensor is left as it was.
    factors = [0.5 + r for r in range(size)]
    for as_tensor in (False, True):
        f = factors[rank]
        f = torch.tensor(f, dtype=torch.float32, device=device) if as_tensor else f
        case += 1
        xs = _inputs(torch, case, size, (1000,), torch.float32, device)
        t = xs[rank].clone()
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(f))
        want = sum(x.double() * g for x, g in zip(xs, factors))
        _close(torch, t, want, f"all_reduce PREMUL_SUM (tensor factor: {as_tensor})", torch.float32)
        case += 1
        xs = _inputs(torch, case, size, (size * 100,), torch.float32, device)
        inp = xs[rank].clone()
        out = torch.full((100,), float("nan"), device=device)
        dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(f))
        want = sum(x.double() * g for x, g in zip(xs, factors))[rank * 100 : (rank + 1) * 100]
        _close(torch, out, want, f"reduce_scatter_tensor PREMUL_SUM (tensor factor: {as_tensor})", torch.float32)
        _close(torch, inp, xs[rank], "reduce_scatter_tensor PREMUL_SUM's input", torch.float32)
    if device.type == "cuda" and hasattr(dist, "split_group"):
        # split_group (PyTorch splits only a default group bound to a device: the GPU case).
        g = dist.split_group(split_ranks=[list(range(size))])
        assert dist.get_process_group_ranks(g) == list(range(size)), dist.get_process_group_ranks(g)
        case += 1
        xs = _inputs(torch, case, size, (333,), torch.float32, device)
        t = xs[rank].clone()
        dist.all_reduce(t, group=g)
        _close(torch, t, sum(x.double() for x in xs), "all_reduce on a split group", torch.float32)
        outs = [torch.full((5,), float("nan"), device=device) for _ in range(size)]
        dist.all_to_all(outs, [torch.full((5,), float(rank * size + p), device=device) for p in range(size)], group=g)
        want = torch.cat([torch.full((5,), float(p * size + rank)) for p in range(size)])
        _close(torch, torch.cat(outs), want, "all_to_all on a split group", torch.float32)
        # new_group on a default group bound to a device (PyTorch then takes it for a split source).
        h = dist.new_group(list(range(size)))
        t = torch.full((7,), float(rank + 1), device=device)
        dist.all_reduce(t, group=h)
        _close(torch, t, torch.full((7,), size * (size + 1) / 2), "all_reduce on a new group", torch.float32)
    # A ring of sends and receives through batch_isend_irecv.
    case += 1
    xs = _inputs(torch, case, size, (777,), torch.float32, device)
    got = torch.full_like(xs[0], float("nan"))
    ops = [
        dist.P2POp(dist.isend, xs[rank], (rank + 1) % size),
        dist.P2POp(dist.irecv, got, (rank - 1) % size),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    _close(torch, got, xs[(rank - 1) % size], "batch_isend_irecv ring", torch.float32)
    dist.barrier()
    if device.type == "cuda":
        # Work.wait() orders the waiting stream after the operation's, as NCCL's does: an
        # all-reduce issued on a side stream behind a ~0.1 s sleep, waited for on the default
        # stream, whose next kernel must read the reduced values (without the wait's event it
        # reads the input, long before the side stream gets to the all-reduce).
        side = torch.cuda.Stream(device)
        x = torch.full((1 << 20,), float(rank + 1), device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
            work = dist.all_reduce(x, async_op=True)
        work.wait()
        y = x * 1.0
        want = torch.full_like(x, size * (size + 1) / 2)
        _close(torch, y, want, "all_reduce on a side stream, consumed after Work.wait()", torch.float32)
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
            fut = dist.all_reduce(x, async_op=True).get_future()
        y = fut.wait()[0] * 1.0
        _close(torch, y, want * size, "all_reduce on a side stream, consumed after its future", torch.float32)
    # Object collectives: PyTorch hands them CPU tensors even on a GPU group (staged there).
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * (rank + 3)})
    assert objs == [{"rank": r, "s": "x" * (r + 3)} for r in range(size)], objs
    lst = [{"k": [1, 2, 3]}, rank] if rank == size - 1 else [None, None]
    dist.broadcast_object_list(lst, src=size - 1)
    assert lst == [{"k": [1, 2, 3]}, size - 1], lst
    got = [None] * size if rank == 0 else None
    dist.gather_object(("r", rank), got, dst=0)
    assert rank != 0 or got == [("r", r) for r in range(size)], got
    if device.type == "cuda":
        # CPU tensors given to the GPU group directly are staged too; a call that fails after
        # staging must not leave its copies to be written back by the next call (over what the
        # caller wrote into its tensors since).
        out = torch.full((3,), float("nan"))
        try:
            dist.reduce_scatter_tensor(out, torch.ones(7))
        except Exception as e:  # noqa: BLE001
            assert "7" in str(e) or "3" in str(e), f"reduce_scatter_tensor of 7 into 3: {e}"
        else:
            raise AssertionError("reduce_scatter_tensor of 7 elements into 3 per rank did not fail")
        out.fill_(5.0)
        t = torch.ones(5)
        dist.all_reduce(t)
        assert t.device.type == "cpu" and bool((t == size).all()), t
        assert bool((out == 5.0).all()), f"a failed call's output was written by a later call: {out}"
    # Functional collectives find the group by its name.
    import torch.distributed._functional_collectives as fc

    case += 1
    xs = _inputs(torch, case, size, (1024,), torch.float32, device)
    y = fc.all_reduce(xs[rank], "sum", dist.group.WORLD)
    _close(torch, fc.wait_tensor(y), sum(x.double() for x in xs).float(), "functional all_reduce", torch.float32)
    z = fc.all_gather_tensor(xs[rank], 0, dist.group.WORLD)
    _close(torch, fc.wait_tensor(z), torch.cat(xs), "functional all_gather_tensor", torch.float32)
    # DDP: after backward, every rank's gradient is the mean of every rank's own gradient.
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = model.to(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    grads = []
    for r in range(size):
        g = torch.Generator().manual_seed(99 + r)
        x = torch.randn(8, 16, generator=g).to(device)
        ref = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        h = torch.nn.functional.linear(x, ref[0], ref[1]).relu()
        torch.nn.functional.linear(h, ref[2], ref[3]).sum().backward()
        grads.append([p.grad for p in ref])
        if r == rank:
            mine = x
    ddp(mine).sum().backward()
    for i, p in enumerate(ddp.module.parameters()):
        want = sum(g[i].double() for g in grads) / size
        _close(torch, p.grad, want, f"DDP gradient of parameter {i}", torch.float32)
    # FSDP2 (fully_shard: all-gathers and reduce-scatters on streams of its own, waited for
    # through Work): the same gradients, unsharded for the comparison.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # The mesh names the device type: by default FSDP2 takes the accelerator where there is one,
    # which the host case (CPU tensors) must not.
    mesh = init_device_mesh(device.type, (size,))
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = model.to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(mine).sum().backward()
    for i, p in enumerate(model.parameters()):
        want = sum(g[i].double() for g in grads) / size
        _close(torch, p.grad.full_tensor(), want, f"FSDP2 gradient of parameter {i}", torch.float32)


def main(rank, size, port, kind, queue):
    """One rank: ``kind`` is "cuda" (torch tensors on the GPU) or "host" (CPU tensors)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if kind == "host":
        os.environ["MSCCLPP_BACKEND"] = "host"
    try:
        import torch
        import torch.distributed as dist

        import mscclpp_rs.torch_backend  # noqa: F401  (registers "mscclpp")

        if kind == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            device = torch.device("cuda", torch.cuda.current_device())
            backend = "cuda:mscclpp"
        else:
            device = torch.device("cpu")
            backend = "cpu:mscclpp"
        dist.init_process_group(backend, rank=rank, world_size=size)
        pg = dist.distributed_c10d._get_default_group()
        name = pg.name() if hasattr(pg, "name") else "?"
        checks(torch, dist, rank, size, device)
        dist.destroy_process_group()
        queue.put((rank, "ok", name))
    except BaseException as e:  # the test shows every rank's failure
        queue.put((rank, type(e).__name__, f"{e}\n{traceback.format_exc()}"))
