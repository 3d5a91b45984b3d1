"""DeepEP's ``Buffer`` API served by ``mscclpp_rs.deep_ep``, checked against torch on every rank:
the layout, dispatch (bf16 and FP8 rows with scales, with and without top-k, cached with a handle,
``num_worst_tokens``, ``expert_alignment``, ``previous_event``/``async_finish``) and combine (with
weights and a bias), outputs compared exactly with a reference made from every rank's inputs.

    python tests/deep_ep_ranks.py --spawn 2 [--device cuda|cpu] [--tokens 64] [--hidden 256]
                                  [--hosts H]

Ranks share the one GPU there is (``cuda:rank % count``), or run on the host backend with CPU
tensors (``--device cpu``); ``--hosts H`` puts them on H simulated hosts (``MSCCLPP_HOSTID``, by
blocks). Past 8 ranks the calls take DeepEP's internode shapes (per-node counts, its internode
handle), which are checked too. Needs torch; used by ``tests/test_deep_ep.py``.
"""

import argparse
import os
import sys


def expect_error(call, words):
    """``call`` raises ValueError whose message holds ``words``."""
    try:
        call()
    except ValueError as e:
        assert words in str(e), (words, str(e))
        return
    raise AssertionError(f"no error, expected one saying {words!r}")


def reference(all_x, all_idx, all_w, rank, n, experts):
    """(rows, local idx, weights, src) this rank should receive: by source, token order."""
    import torch

    local = experts // n
    xs, idxs, ws, srcs, per_source = [], [], [], [], []
    for s in range(n):
        idx = all_idx[s]
        here = ((idx >= 0) & (idx // local == rank)).any(1)
        t = torch.nonzero(here).flatten()
        per_source.append(len(t))
        xs.append(all_x[s][t])
        mine = (idx[t] >= 0) & (idx[t] // local == rank)
        idxs.append(torch.where(mine, idx[t] - rank * local, torch.full_like(idx[t], -1)))
        ws.append(torch.where(mine, all_w[s][t], torch.zeros_like(all_w[s][t])))
        srcs.append(t.to(torch.int32))
    return torch.cat(xs), torch.cat(idxs), torch.cat(ws), torch.cat(srcs), per_source


def rank_main(rank, n, port, device, tokens, hidden, experts, topk, hosts=1):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if hosts > 1:
        os.environ["MSCCLPP_HOSTID"] = f"deep-ep-{port}-{rank // (n // hosts)}"
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        os.environ["MSCCLPP_BACKEND"] = "host"
        dev = torch.device("cpu")
    dist.init_process_group("gloo", rank=rank, world_size=n)
    import mscclpp_rs.compat

    deep_ep = mscclpp_rs.compat.install_deep_ep()
    import deep_ep as again

    assert again is deep_ep and deep_ep.IMPLEMENTATION == "mscclpp_rs"
    group = dist.group.WORLD
    hint = deep_ep.Config().get_nvl_buffer_size_hint(hidden * 2, n, tokens, topk)
    buf = deep_ep.Buffer(group, hint, 0, explicitly_destroy=True)

    g = torch.Generator().manual_seed(1000 + rank)
    t_mine = tokens - rank  # ranks with different token counts
    scores = torch.rand((t_mine, experts), generator=g)
    idx = torch.topk(scores, topk, dim=1).indices.to(torch.int64)
    idx[torch.rand(idx.shape, generator=g) < 0.1] = -1
    x = (torch.randn((t_mine, hidden), generator=g) * 4).to(torch.bfloat16)
    w = torch.rand((t_mine, topk), generator=g) + 0.25

    def gather(t):
        out = [None] * n
        dist.all_gather_object(out, t.cpu())
        return out

    all_x, all_idx, all_w = gather(x), gather(idx), gather(w)
    want_x, want_idx, want_w, want_src, per_source = reference(all_x, all_idx, all_w, rank, n,
                                                                experts)
    rows = sum(per_source)
    local = experts // n

    # Layout.
    per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(idx.to(dev), experts)
    owner_hit = torch.zeros((t_mine, n), dtype=torch.int32)
    valid = idx >= 0
    owner_hit.scatter_add_(1, torch.where(valid, idx // local, 0), valid.to(torch.int32))
    if n > 8:
        # DeepEP's internode layout: tokens bound for each node of 8 ranks.
        to_node = (owner_hit > 0).view(t_mine, n // 8, 8).any(2)
        assert torch.equal(per_rdma.cpu(), to_node.sum(0, dtype=torch.int32)), "per node"
    else:
        assert per_rdma is None
    assert torch.equal(in_rank.cpu(), owner_hit > 0)
    assert torch.equal(per_rank.cpu(), (owner_hit > 0).sum(0, dtype=torch.int32))
    assert torch.equal(per_expert.cpu(), torch.bincount(idx[valid], minlength=experts).int())

    # Dispatch with top-k, bf16, after a captured event, asynchronously.
    prev = buf.capture()
    recv_x, recv_idx, recv_w, per_expert_list, handle, ev = buf.dispatch(
        x.to(dev), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=idx.to(dev), topk_weights=w.to(dev),
        expert_alignment=4, previous_event=prev, async_finish=True,
        allocate_on_comm_stream=True)
    ev.current_stream_wait()
    assert recv_x.shape == (rows, hidden), (recv_x.shape, rows)
    assert torch.equal(recv_x.cpu(), want_x), "recv_x"
    assert torch.equal(recv_idx.cpu(), want_idx), "recv_topk_idx"
    assert torch.equal(recv_w.cpu(), want_w), "recv_topk_weights"
    internode = n > 8
    assert len(handle) == (10 if internode else 6)
    assert torch.equal(handle[7 if internode else 3].cpu(), want_src), "recv_src_idx"
    counts = [int((want_idx == e).sum()) for e in range(local)]
    assert per_expert_list == [(c + 3) // 4 * 4 for c in counts], (per_expert_list, counts)
    want_prefix = [sum(per_source[: i + 1]) for i in range(n)]
    if internode:
        # recv_gbl_rank_prefix_sum (handle[-4]), which DeepEP's internode test reads.
        assert handle[-4].cpu().tolist() == want_prefix, "recv_gbl_rank_prefix_sum"
        assert torch.equal(handle[0].cpu(), owner_hit > 0), "is_token_in_rank"
    else:
        prefix = handle[0].cpu()
        assert [int(prefix[i][rank]) for i in range(n)] == want_prefix

    # Combine with the weights, and again with a bias.
    combined, combined_w, _ = buf.combine(recv_x, handle, topk_weights=recv_w)
    sent_to = (owner_hit > 0).sum(1, keepdim=True).float()
    want_c = (x.float() * sent_to).to(torch.bfloat16)
    assert torch.equal(combined.cpu(), want_c), "combined_x"
    assert torch.equal(combined_w.cpu(), torch.where(valid, w, torch.zeros_like(w))), "weights"
    bias = torch.full((t_mine, hidden), 0.5, dtype=torch.bfloat16)
    with_bias, none_w, _ = buf.combine(recv_x, handle, bias=bias.to(dev))
    assert none_w is None
    assert torch.equal(with_bias.cpu(), (want_c.float() + 0.5).to(torch.bfloat16)), "bias"

    # Cached dispatch (the handle's routing), FP8 rows with scales.
    x8 = x.float().clamp(-448, 448).to(torch.float8_e4m3fn)
    scales = torch.rand((t_mine, (hidden + 127) // 128), generator=g)
    got8, none_idx, none_w, none_list, none_h, _ = buf.dispatch((x8.to(dev), scales.to(dev)),
                                                               handle=handle)
    assert none_idx is None and none_h is None and none_list is None
    want8 = reference([t.float().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
                       for t in all_x], all_idx, all_w, rank, n, experts)[0]
    assert torch.equal(got8[0].cpu().view(torch.uint8), want8), "fp8 rows"
    all_s = gather(scales)
    want_s = reference(all_s, all_idx, all_w, rank, n, experts)[0]
    assert torch.equal(got8[1].cpu(), want_s), "fp8 scales"
    # FP8 with top-k, not cached, the scales column-major as DeepEP's own test passes them
    # (`scales.T.contiguous().T`): what `is_sm90_compiled()` = True lets its FP8 cases send.
    col = scales.T.contiguous().T
    assert scales.shape[1] == 1 or not col.is_contiguous()
    f8, f8_idx, f8_w, _, _, _ = buf.dispatch(
        (x8.to(dev), col.to(dev)), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=idx.to(dev), topk_weights=w.to(dev))
    assert torch.equal(f8[0].cpu().view(torch.uint8), want8), "fp8 rows with top-k"
    assert torch.equal(f8[1].cpu(), want_s), "fp8 column-major scales with top-k"
    assert torch.equal(f8_idx.cpu(), want_idx) and torch.equal(f8_w.cpu(), want_w)

    # No top-k: routed by is_token_in_rank alone; the same rows.
    nx, nidx, nw, nlist, nh, _ = buf.dispatch(
        x.to(dev), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert)
    assert nidx is None and nw is None
    assert torch.equal(nx.cpu(), want_x), "rows without top-k"
    # Each local expert's count is what every rank's layout counted for it (DeepEP's own test
    # checks this without top-k too).
    every = torch.stack([torch.bincount(t[(t >= 0) & (t < experts)], minlength=experts)
                         for t in all_idx]).sum(0)
    assert nlist == every[rank * local:(rank + 1) * local].tolist(), ("counts without top-k",
                                                                      nlist)

    # num_worst_tokens: no host sync, every row slot returned, the tail's experts -1.
    worst = tokens * n
    wx, widx, ww, wlist, wh, _ = buf.dispatch(
        x.to(dev), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=idx.to(dev), topk_weights=w.to(dev),
        num_worst_tokens=worst)
    if device == "cuda":
        torch.cuda.synchronize()
    assert wlist == [] and wx.shape == (worst, hidden)
    assert torch.equal(wx[:rows].cpu(), want_x) and bool((widx[rows:] == -1).all())
    wc, _, _ = buf.combine(wx, wh, topk_weights=ww)
    assert torch.equal(wc.cpu(), want_c), "combined after num_worst_tokens"
    # Dispatches with and without top-k, BF16 and FP8, went through one exchange: the Buffer's
    # bytes are held once, not once per top-k (DeepEP's internode test at 16 ranks on one GPU
    # needs that to fit).
    assert len(buf._exchanges) == 1, ("exchanges of one Buffer", list(buf._exchanges))
    # Handles not of this Buffer's dispatch: refused naming why, nothing run.
    expect_error(lambda: buf.combine(wx, tuple(wh)), "not returned by this Buffer's dispatch")
    other = deep_ep.Buffer(group, hint, 0, explicitly_destroy=True)
    expect_error(lambda: other.combine(wx, wh), "not returned by this Buffer's dispatch")
    other.destroy()

    buf.destroy()
    low_latency(rank, n, dev, tokens, hidden, experts, topk, gather, device)
    # The form a CUDA graph captures (every top-k entry, no host read), run eagerly; then, on
    # GPUs, captured and replayed.
    from mscclpp_rs.deep_ep import _ExpertLayout
    _ExpertLayout.every_entry = True
    low_latency(rank, n, dev, tokens, hidden, experts, topk, gather, device)
    _ExpertLayout.every_entry = False
    if device == "cuda":
        low_latency_graph(rank, n, dev, tokens, hidden, experts, topk)
    elif rank == 0:
        print("deep_ep_ranks: low-latency graph capture not checked (CPU tensors: no CUDA graph)")
    dist.destroy_process_group()
    if rank == 0:
        print(f"deep_ep_ranks: {n} ranks on {device}: every check passed "
              f"({rows} rows received by rank 0)", flush=True)


def low_latency(rank, n, dev, tokens, hidden, experts, topk, gather, device):
    """``low_latency_dispatch``/``low_latency_combine``: the per-expert layout (rows, counts,
    ``src_info``, ``layout_range``) exactly; bf16 combine exactly (dyadic weights make every
    product and sum exact in f32); FP8 rows within FP8's precision of the originals."""
    import deep_ep
    import torch
    import torch.distributed as dist

    big_n = tokens
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(big_n, hidden, n, experts)
    buf = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True,
                         num_qps_per_rank=experts // n, explicitly_destroy=True)
    g = torch.Generator().manual_seed(2000 + rank)
    t_mine = tokens - rank
    idx = torch.topk(torch.rand((t_mine, experts), generator=g), topk, dim=1).indices
    idx[torch.rand(idx.shape, generator=g) < 0.1] = -1
    x = (torch.randn((t_mine, hidden), generator=g) * 4).to(torch.bfloat16)
    w = torch.randint(1, 17, (t_mine, topk), generator=g).float() / 8
    all_x, all_idx = gather(x), gather(idx)
    local = experts // n
    stats = torch.zeros(local, dtype=torch.int32, device=dev)
    recv_x, recv_count, handle, ev, hook = buf.low_latency_dispatch(
        x.to(dev), idx.to(dev), big_n, experts, cumulative_local_expert_recv_stats=stats,
        use_fp8=False, return_recv_hook=True)
    hook()
    src_info, ranges = handle[0].cpu(), handle[1].cpu()
    # Expert e of this rank: the rows of every source holding e, sources in order.
    for e in range(local):
        glob = rank * local + e
        rows = [(s, int(t)) for s in range(n)
                for t in torch.nonzero((all_idx[s] == glob).any(1)).flatten()]
        assert int(recv_count[e]) == len(rows) == int(stats[e]), (e, recv_count[e], len(rows))
        for j, (s, t) in enumerate(rows):
            assert torch.equal(recv_x[e, j].cpu(), all_x[s][t]), f"expert {e} slot {j}"
            assert int(src_info[e, j]) == t
        begin = 0
        for s in range(n):
            c = sum(1 for q, _ in rows if q == s)
            assert int(ranges[e, s]) == (begin << 32) | c, (e, s, int(ranges[e, s]))
            begin += c
    # Combine: each expert's output is its rows times (local expert + 1).
    scale = torch.arange(1, local + 1, dtype=torch.float32, device=dev).view(local, 1, 1)
    y = (recv_x.float() * scale).to(torch.bfloat16)
    got, _, _ = buf.low_latency_combine(y, idx.to(dev), w.to(dev), handle)
    # What each expert returned (rounded to bf16 there), weighted and summed exactly in f32.
    # On one host (the exchange's expert-major form) each rank sums its experts' weighted rows
    # and sends the sum back in bf16; across hosts the rows are summed once, at the source.
    per_rank = buf._exchange(experts, topk, hidden).expert_major
    want = torch.zeros((t_mine, hidden))
    for d in range(n) if per_rank else (None,):
        part = torch.zeros((t_mine, hidden))
        for k in range(topk):
            y_k = (x.float() * (idx[:, k] % local + 1).float().unsqueeze(1)).to(torch.bfloat16)
            on = idx[:, k:k + 1] >= 0
            if d is not None:
                on = on & (idx[:, k:k + 1] // local == d)
            part += torch.where(on, w[:, k:k + 1] * y_k.float(), 0.0)
        want += part.to(torch.bfloat16).float() if per_rank else part
    want = want.to(torch.bfloat16)
    assert torch.equal(got.cpu(), want), "low-latency combine"
    # With the receive hook: a send launch now, the receive launch when the hook is called.
    hooked, _, hk = buf.low_latency_combine(y, idx.to(dev), w.to(dev), handle,
                                            return_recv_hook=True)
    hk()
    assert torch.equal(hooked.cpu(), want), "low-latency combine through the receive hook"
    # zero_copy: the same through the buffer the library hands out.
    buf.get_next_low_latency_combine_buffer(handle).copy_(y)
    out = torch.empty_like(got)
    zc, _, _ = buf.low_latency_combine(None, idx.to(dev), w.to(dev), handle, zero_copy=True,
                                       out=out)
    assert zc is out and torch.equal(out.cpu(), want), "zero-copy combine"
    # Two hooked dispatches before either hook is called (two micro-batches overlapped): the
    # second launches the first's receive half first, whose hook then does nothing; each gives
    # what a lone call gives, and the combine takes the last one's handle.
    ra, ca, _, _, hka = buf.low_latency_dispatch(x.to(dev), idx.to(dev), big_n, experts,
                                                 use_fp8=False, return_recv_hook=True)
    rb, cb, hlast, _, hkb = buf.low_latency_dispatch(x.to(dev), idx.to(dev), big_n, experts,
                                                     use_fp8=False, return_recv_hook=True)
    hkb()
    hka()
    for got_x, got_c in ((ra, ca), (rb, cb)):
        assert torch.equal(got_c.cpu(), recv_count.cpu()), "overlapped dispatch counts"
        for e in range(local):
            c = int(recv_count[e])
            assert torch.equal(got_x[e, :c].cpu(), recv_x[e, :c].cpu()), "overlapped dispatch"
    again, _, _ = buf.low_latency_combine(y, idx.to(dev), w.to(dev), hlast)
    assert torch.equal(again.cpu(), want), "combine after overlapped dispatches"
    # A low-latency handle is not a normal one, nor the reverse.
    expect_error(lambda: buf.combine(y[0], handle), "a handle of low_latency_dispatch")
    expect_error(lambda: buf.low_latency_combine(y, idx.to(dev), w.to(dev), tuple(handle)),
                 "not returned by this Buffer's low_latency_dispatch")
    # FP8 (with power-of-two scales too): rows within FP8's precision.
    for round_scale in (False, True):
        (x8, sc), cnt, h8, _, _ = buf.low_latency_dispatch(
            x.to(dev), idx.to(dev), big_n, experts, use_fp8=True, round_scale=round_scale)
        assert torch.equal(cnt.cpu(), recv_count.cpu())
        back = (x8.float().view(local, -1, hidden // 128, 128) * sc.unsqueeze(3)).view(
            local, -1, hidden)
        # The slots each expert received (past them nothing is promised, as in DeepEP).
        used = (torch.arange(back.shape[1], device=back.device).view(1, -1)
                < cnt.view(-1, 1)).unsqueeze(2)
        back = torch.where(used, back, 0.0)
        ref = torch.where(used, recv_x.float(), 0.0)
        diff = 1 - 2 * float((back * ref).sum()) / float((back * back + ref * ref).sum())
        assert diff < 1e-3, (round_scale, diff)
        if round_scale:
            assert bool((torch.log2(sc[sc > 0]).frac() == 0).all()), "scales not powers of two"
        if round_scale and hidden % 512:
            expect_error(lambda: buf.low_latency_dispatch(
                x.to(dev), idx.to(dev), big_n, experts, use_fp8=True, round_scale=True,
                use_ue8m0=True), "multiple of 512")
        elif round_scale:
            # Packed UE8M0 (DeepEP's use_ue8m0): the same rows, each scale's exponent in a
            # byte, four per int32, column-major per expert; decoded as DeepEP's test does.
            (u8, packed), _, _, _, _ = buf.low_latency_dispatch(
                x.to(dev), idx.to(dev), big_n, experts, use_fp8=True, round_scale=True,
                use_ue8m0=True)
            assert packed.dtype == torch.int32 and packed.shape == (local, sc.shape[1],
                                                                     hidden // 512)
            assert packed.transpose(1, 2).is_contiguous(), "packed scales not column-major"
            u = used.squeeze(2)
            assert torch.equal(u8.view(torch.uint8)[u], x8.view(torch.uint8)[u])
            decoded = (packed.contiguous().view(torch.uint8).to(torch.int32) << 23).view(
                torch.float32).view(sc.shape)
            live = u.unsqueeze(2) & (sc > 0)
            assert torch.equal(decoded[live], sc[live]), "UE8M0 scales"
    expect_error(lambda: buf.low_latency_dispatch(x.to(dev), idx.to(dev), big_n, experts,
                                                  use_fp8=False, round_scale=True,
                                                  use_ue8m0=True), "use_ue8m0")
    buf.destroy()


def low_latency_graph(rank, n, dev, tokens, hidden, experts, topk):
    """``low_latency_dispatch`` and ``low_latency_combine`` captured in one CUDA graph (as
    decode engines capture them), replayed with new routings and rows copied into the captured
    inputs: each replay's outputs equal an eager call's on the same data."""
    import deep_ep
    import torch
    import torch.distributed as dist

    big_n = tokens
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(big_n, hidden, n, experts)
    buf = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True,
                         num_qps_per_rank=experts // n, explicitly_destroy=True)
    local = experts // n

    def data(seed):
        g = torch.Generator().manual_seed(seed * 100 + rank)
        idx = torch.topk(torch.rand((big_n, experts), generator=g), topk, dim=1).indices
        idx[torch.rand(idx.shape, generator=g) < 0.2] = -1
        x = (torch.randn((big_n, hidden), generator=g) * 4).to(torch.bfloat16)
        w = torch.randint(1, 17, (big_n, topk), generator=g).float() / 8
        return x.to(dev), idx.to(dev), w.to(dev)

    scale = torch.arange(1, local + 1, dtype=torch.float32, device=dev).view(local, 1, 1)

    def step(x, idx, w):
        recv_x, count, handle, _, _ = buf.low_latency_dispatch(x, idx, big_n, experts,
                                                               use_fp8=False)
        y = (recv_x.float() * scale).to(torch.bfloat16)
        out, _, _ = buf.low_latency_combine(y, idx, w, handle)
        return recv_x, count, handle[0], out

    sx, sidx, sw = data(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(sx, sidx, sw)  # eager on the capture stream first: the exchanges are made once
    torch.cuda.current_stream().wait_stream(side)
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_recv, g_count, g_src, g_out = step(sx, sidx, sw)
    for seed in (1, 2, 3):
        x, idx, w = data(seed)
        sx.copy_(x)
        sidx.copy_(idx)
        sw.copy_(w)
        dist.barrier()
        graph.replay()
        torch.cuda.synchronize()
        got = [t.clone() for t in (g_recv, g_count, g_src, g_out)]
        dist.barrier()
        want = step(x, idx, w)
        torch.cuda.synchronize()
        count = want[1]
        assert torch.equal(got[1], count), f"replay {seed}: counts"
        for e in range(local):
            c = int(count[e])
            assert torch.equal(got[0][e, :c], want[0][e, :c]), f"replay {seed}: expert {e} rows"
            assert torch.equal(got[2][e, :c], want[2][e, :c]), f"replay {seed}: src_info"
        assert torch.equal(got[3], want[3]), f"replay {seed}: combine"
        dist.barrier()
    if rank == 0:
        print(f"deep_ep_ranks: low-latency dispatch and combine captured in a CUDA graph, "
              f"3 replays with new data equal to eager calls", flush=True)
    del graph
    buf.destroy()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spawn", type=int, default=2)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--hosts", type=int, default=1)
    a = p.parse_args()
    if a.hosts < 1 or a.spawn % a.hosts:
        p.error(f"--hosts {a.hosts}: the {a.spawn} ranks must split evenly")
    if a.tokens <= a.spawn:
        p.error(f"--tokens {a.tokens}: rank r sends tokens - r, so more than {a.spawn} are needed")
    import torch.multiprocessing as tmp

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cluster import free_port

    tmp.spawn(rank_main, args=(a.spawn, free_port(), a.device, a.tokens, a.hidden, a.experts,
                               a.topk, a.hosts), nprocs=a.spawn)


if __name__ == "__main__":
    main()
