"""Drives SGLang's MSCCL++ all-reduce (``python/sglang/srt/distributed/device_communicators/
pymscclpp.py`` of sgl-project/sglang), UNCHANGED, on mscclpp_rs's ``mscclpp`` API.

The file is SGLang's, not ours: it is not shipped; pass its path in ``SGLANG_PYMSCCLPP``. The
harness stubs the SGLang modules it imports (server args, compile-phase checks) through
``sys.modules``, installs our ``mscclpp`` (``mscclpp_rs.compat.install()``), loads the file by
path, and on every rank: builds ``PyMscclppCommunicator`` over a Gloo group (its tuner runs),
then all-reduces fp16/bf16/fp32 tensors from 512 B to 8 MiB through it and checks every element.

    SGLANG_PYMSCCLPP=/path/to/pymscclpp.py python tests/sglang_harness.py --spawn 8 [--quick]
    SGLANG_PYMSCCLPP=... torchrun --nproc-per-node 8 tests/sglang_harness.py [--quick]

SGLang serves only 8, 16 and 32 ranks; 8 ranks may share fewer GPUs (rank r uses GPU
r % device_count). At 16 and 32 ranks the file compiles MSCCL++'s multi-node DSL all-reduce for
``world_size // torch.cuda.device_count()`` nodes (2 or 4); ``--hosts H`` simulates them on one
machine: rank r gets ``MSCCLPP_HOSTID`` ``<tag>-<r // (N/H)>`` and the file's
``torch.cuda.device_count()`` answers N/H (the harness patches torch, not the file).
``--quick`` cuts the tuner's candidate lists (first nblocks and nthreads of each algorithm) and its repetition counts, in the harness, not in SGLang's file. Needs torch with
a CUDA device; it exits 0 after printing ``harness: skip: <why>`` where they are absent.
"""

import argparse
import importlib.util
import os
import sys
import time
import types

MODULE = "sglang.srt.distributed.device_communicators.pymscclpp"


def _skip(why):
    print(f"harness: skip: {why}", flush=True)
    sys.exit(0)


def stub_sglang(symm_mem=False):
    """The SGLang modules pymscclpp.py imports, as stand-ins: no piecewise CUDA graph, no
    torch.compile warm-up, server args with ``enable_symm_mem``."""

    def mod(name, **attrs):
        m = sys.modules.get(name) or types.ModuleType(name)
        m.__path__ = getattr(m, "__path__", [])
        for k, v in attrs.items():
            setattr(m, k, v)
        sys.modules[name] = m
        return m

    for name in ("sglang", "sglang.srt", "sglang.srt.compilation", "sglang.srt.model_executor",
                 "sglang.srt.model_executor.runner_backend_utils", "sglang.srt.distributed",
                 "sglang.srt.distributed.device_communicators"):
        mod(name)
    mod("sglang.srt.compilation.compile_phase", get_pcg_capture_stream=lambda: None,
        is_in_torch_compile_warmup=lambda: False)
    mod("sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph",
        is_in_tc_piecewise_cuda_graph=lambda: False)
    args = types.SimpleNamespace(enable_symm_mem=symm_mem)
    mod("sglang.srt.server_args", get_global_server_args=lambda: args)


def load_pymscclpp(path):
    spec = importlib.util.spec_from_file_location(MODULE, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = m
    spec.loader.exec_module(m)
    return m


def cut_candidates(cls, quick):
    """--quick: one launch shape per algorithm and fewer repetitions (wrapping the methods); of
    the multi-node DSL algorithms (all sixteen still compiled), those of 256 threads per block
    and thread-block groups of 1 and 8."""
    if not quick:
        return
    native, dsl, tune = cls._create_native_algorithms, cls._create_dsl_algorithms, cls._tune

    def create(self):
        return [(a, nb[:1], nt[:1]) for a, nb, nt in native(self)]

    def create_dsl(self):
        # The extremes of the thread-block groups (1 and 8), 256 threads per block: on one GPU
        # shared by 16 processes each timing costs seconds.
        keep = ("_1TBG_256TPB", "_8TBG_256TPB")
        return [c for c in dsl(self) if c[0].name.endswith(keep)]

    def short_tune(self, n_warmup, n_graph_launches, n_ops_per_graph, algos_config):
        return tune(self, 1, 2, 2, algos_config)

    cls._create_native_algorithms, cls._tune = create, short_tune
    cls._create_dsl_algorithms = create_dsl


def cut_sizes(cls, sizes):
    """--tune-sizes: the tuner times only these message sizes (the others are left untuned, so
    the file sends them elsewhere, as it does below 1 KiB at 16 ranks): with 16 processes
    time-slicing one GPU an execution takes far longer than on GPUs of their own."""
    if not sizes:
        return
    timed = cls._get_time

    def get_time(self, algo, tensor, size, *args):
        return timed(self, algo, tensor, size, *args) if size in sizes else float("inf")

    cls._get_time = get_time


def parse_sizes(text):
    """``1K,64K,1M`` as byte counts (powers of two from 512 B to 8 MiB: the sizes the tuner
    times)."""
    out = set()
    for part in filter(None, text.split(",")):
        scale = {"K": 1 << 10, "M": 1 << 20}.get(part[-1].upper(), 1)
        try:
            n = int(part[:-1] if scale > 1 else part) * scale
        except ValueError:
            raise SystemExit(f"harness: --tune-sizes {part}: expected e.g. 512, 64K or 1M") from None
        if n < 512 or n > 8 << 20 or n & (n - 1):
            raise SystemExit(f"harness: --tune-sizes {part}: not a power of two from 512 to 8M")
        out.add(n)
    return out


def progress(rank, stage, t0=time.monotonic()):
    """Rank 0 says where the run is, so that a run stopped by its time limit tells which stage
    it was in (a cold start of 16 processes on one GPU can take minutes)."""
    if rank == 0:
        print(f"harness: {stage} ({time.monotonic() - t0:.0f} s)", flush=True)


def watch_stages(cls, rank, trace=0):
    """Wrap the tuner's stages (compiling the algorithms, tuning, each algorithm and size it
    times) with progress lines; with ``trace`` > 0, rank 0 also reports each of the first
    ``trace`` executions (its result and how long it took to finish on the GPU; outside a graph
    capture, which cannot wait), so that a slow or stuck first call shows itself."""
    timed = cls._get_time
    if trace > 0:
        import torch

        run = cls._run_algo
        seen = [0]

        def traced(self, algo, tensor, size, nblocks, nthreads, *args):
            if seen[0] >= trace:
                return run(self, algo, tensor, size, nblocks, nthreads, *args)
            seen[0] += 1
            t = time.monotonic()
            rc = run(self, algo, tensor, size, nblocks, nthreads, *args)
            capturing = torch.cuda.is_current_stream_capturing()
            if not capturing:
                torch.cuda.current_stream().synchronize()
            progress(rank, f"execute {seen[0]}: {algo.name} {size} B nblocks={nblocks} "
                           f"nthreads={nthreads}: returned {rc}"
                           f"{' (captured)' if capturing else ''} in "
                           f"{(time.monotonic() - t) * 1e3:.1f} ms")
            return rc

        cls._run_algo = traced

    def get_time(self, algo, tensor, size, *args):
        out = timed(self, algo, tensor, size, *args)
        progress(rank, f"tuned {algo.name} at {size} B")
        return out

    cls._get_time = get_time
    for name in ("_create_dsl_algorithms", "_create_native_algorithms", "_tune"):
        inner = getattr(cls, name)

        def staged(self, *args, _inner=inner, _name=name):
            progress(rank, f"{_name} begins")
            out = _inner(self, *args)
            progress(rank, f"{_name} done")
            return out

        setattr(cls, name, staged)


def rank_main(rank, size, quick, port, hosts=1, tag="sglang", trace=0, sizes=()):
    import torch
    import torch.distributed as dist

    progress(rank, "torch imported")

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    ndev = torch.cuda.device_count()
    torch.cuda.set_device(rank % ndev)
    if hosts > 1:
        if size % hosts:
            raise SystemExit(f"harness: {size} ranks do not split into {hosts} hosts")
        per_host = size // hosts
        os.environ["MSCCLPP_HOSTID"] = f"{tag}-{rank // per_host}"
        # SGLang's file takes its ranks per node from the device count.
        torch.cuda.device_count = lambda: per_host
    dist.init_process_group("gloo", rank=rank, world_size=size)
    import mscclpp_rs.compat

    mscclpp_rs.compat.install()
    stub_sglang()
    m = load_pymscclpp(os.environ["SGLANG_PYMSCCLPP"])
    cls = m.PyMscclppCommunicator
    cut_candidates(cls, quick)
    watch_stages(cls, rank, trace)
    cut_sizes(cls, sizes)  # outermost: a size left out is neither timed nor reported
    progress(rank, "process group up; building the communicator")
    comm = cls(dist.group.WORLD, torch.device(f"cuda:{rank % ndev}"))
    assert comm.available, "import mscclpp failed under the harness"
    assert getattr(comm, "best_configs", None), "the tuner chose nothing (world size not 8/16/32?)"
    if rank == 0:
        for s, (algo, nb, nt) in sorted(comm.best_configs.items()):
            print(f"harness: tuned {s:>8} B: {algo.name} nblocks={nb} nthreads={nt}", flush=True)
    progress(rank, "checking every tuned size")
    wrong = checked = 0
    with comm.change_state(enable=True):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for nbytes in [1 << i for i in range(9, 24)]:
                if comm._get_tuned_config(nbytes) is None:
                    # The multi-node algorithms start at 1 KiB (SGLang's min_message_size): the
                    # file sends smaller tensors elsewhere (should_mscclpp_allreduce is False).
                    assert size != 8 or (sizes and nbytes not in sizes), \
                        f"no algorithm tuned for {nbytes} B at 8 ranks"
                    continue
                checked += 1
                n = nbytes // torch.tensor([], dtype=dtype).element_size()
                base = torch.arange(n, device="cuda", dtype=torch.float32) % 13
                x = (base + rank).to(dtype)
                assert comm.should_mscclpp_allreduce(x), (dtype, nbytes)
                comm.all_reduce(x)
                torch.cuda.synchronize()
                want = (base * size + size * (size - 1) / 2).to(dtype)
                bad = int((x != want).sum())
                if bad:
                    print(f"harness: rank {rank} {dtype} {nbytes} B: {bad} wrong", flush=True)
                wrong += bad
    t = torch.tensor([wrong])
    dist.all_reduce(t)
    if rank == 0:
        print(f"harness: all-reduce correct ({checked} dtype/size cases)" if int(t) == 0
              else f"harness: {int(t)} wrong", flush=True)
    comm.destroy()
    dist.destroy_process_group()
    if int(t):
        sys.exit(1)


def commgroup_selftest(size):
    """CommGroup(torch_group=) over Gloo on the host backend (CPU tensors): the mscclpp API's
    torch bootstrap and an all-reduce by name, no GPU needed."""
    import torch.multiprocessing as tmp

    from cluster import free_port

    tmp.spawn(_commgroup_rank, args=(size, free_port()), nprocs=size)
    return "ok"


def _commgroup_rank(rank, size, port):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    import mscclpp
    import mscclpp.ext

    g = mscclpp.CommGroup(torch_group=dist.group.WORLD, rank=rank, size=size, backend="host")
    algos = {a.name: a for a in mscclpp.ext.AlgorithmCollectionBuilder().build_default_algorithms(
        scratch_buffer=0, scratch_buffer_size=0, rank=rank)}
    x = torch.full((1024,), float(rank + 1))
    rc = algos["default_allreduce_packet"].execute(
        comm=g.communicator, executor=mscclpp.Executor(g.communicator),
        input_buffer=x.data_ptr(), output_buffer=x.data_ptr(), input_size=x.nbytes,
        output_size=x.nbytes, dtype=mscclpp.DataType.float32, op=mscclpp.ReduceOp.SUM, stream=0,
        nblocks=0, nthreads_per_block=0, symmetric_memory=False)
    assert rc == 0 and bool((x == size * (size + 1) / 2).all()), (rc, x[:4])
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spawn", type=int, default=0, help="spawn N ranks here (else torchrun's)")
    p.add_argument("--quick", action="store_true", help="cut the tuner's candidates")
    p.add_argument("--hosts", type=int, default=1,
                   help="simulated hosts (MSCCLPP_HOSTID per group of ranks; 16/32 ranks)")
    p.add_argument("--trace", type=int, default=0,
                   help="rank 0 reports each of the first N executions and how long it took")
    p.add_argument("--tune-sizes", default="",
                   help="only these message sizes are tuned (e.g. 1K,64K,1M); default: all")
    a = p.parse_args()
    sizes = parse_sizes(a.tune_sizes)
    path = os.environ.get("SGLANG_PYMSCCLPP")
    if not path or not os.path.isfile(path):
        _skip("SGLANG_PYMSCCLPP does not name SGLang's pymscclpp.py")
    try:
        import torch
    except ImportError:
        _skip("torch is not installed (SGLang's pymscclpp.py imports it)")
    if not torch.cuda.is_available():
        _skip("torch sees no CUDA device (SGLang's pymscclpp.py runs on torch.cuda)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if a.spawn:
        import torch.multiprocessing as tmp

        from cluster import free_port

        tag = f"sglang-{os.getpid()}"
        tmp.spawn(rank_main,
                  args=(a.spawn, a.quick, free_port(), a.hosts, tag, a.trace, sizes),
                  nprocs=a.spawn)
    else:
        rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a.quick, 0, a.hosts,
                  f"sglang-{os.environ.get('MASTER_PORT', '0')}", a.trace, sizes)


if __name__ == "__main__":
    main()
