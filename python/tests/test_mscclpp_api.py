"""MSCCL++'s Python API (`import mscclpp`, served by mscclpp_rs.mscclpp): its default
algorithms by name on 2 and 3 host-backend ranks (NumPy, no torch), NVLS names and bad launch
shapes refused with MSCCL++'s codes, RawGpuBuffer through DLPack, Executor/ExecutionPlan, the
DSL hand-off, and how a user picks ours or a real MSCCL++ (a fake one on sys.path). The torch
and GPU cases skip with the reason where torch or a GPU is absent; SGLang's own pymscclpp.py is
driven by sglang_harness.py (see docs/mscclpp-api.md)."""

import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

import pytest

from cluster import HOST, free_port

HERE = os.path.dirname(__file__)
DEADLINE = 180

MSCCLPP_DEFAULTS = sorted([
    "default_allreduce_allpair_packet", "default_allreduce_nvls_packet",
    "default_allreduce_nvls_warp_pipeline", "default_allreduce_nvls_block_pipeline",
    "default_allreduce_packet", "default_allreduce_nvls_zero_copy", "default_allreduce_fullmesh",
    "default_allreduce_rsag", "default_allreduce_rsag_pipeline",
    "default_allreduce_rsag_zero_copy", "default_allgather_fullmesh", "default_allgather_fullmesh2",
])


def run_ranks(size, case, env=None, rank_env=None):
    """Runs `case` on `size` host-backend ranks; `rank_env(r)` adds variables per rank."""
    import mscclpp_api_ranks

    ctx = mp.get_context("spawn")
    addr = f"127.0.0.1:{free_port()}"
    pipes, procs = [], []
    for r in range(size):
        a, b = ctx.Pipe()
        e = dict(HOST, **(env or {}), **(rank_env(r) if rank_env else {}))
        p = ctx.Process(target=mscclpp_api_ranks.serve,
                        args=(r, size, addr, case, b, e), daemon=True)
        p.start()
        pipes.append(a)
        procs.append(p)
    results = []
    try:
        for r, a in enumerate(pipes):
            assert a.poll(DEADLINE), f"rank {r} did not answer {case} in {DEADLINE} s"
            kind, value = a.recv()
            assert kind == "ok", f"rank {r}: {value}"
            results.append(value)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return results


@pytest.mark.parametrize("size", [2, 3])
def test_mscclpp_default_algorithms_host(size):
    for out in run_ranks(size, "default_algorithms"):
        assert out["names"] == MSCCLPP_DEFAULTS
        codes = out["codes"]
        for name in ("default_allreduce_nvls_packet", "default_allreduce_nvls_zero_copy",
                     "default_allreduce_nvls_warp_pipeline", "default_allreduce_nvls_block_pipeline"):
            assert codes[name] == 5, (name, codes)  # COMM_INVALID_USAGE: no multicast here
        assert codes["packet_113_blocks"] == 4  # COMM_INVALID_ARGUMENT, as MSCCL++ (max 112)
        assert codes["threads_2048"] == 4
        assert codes["nop"] == 4 and codes["fnuz"] == 4
        assert codes["min"] == 0


def test_mscclpp_raw_gpu_buffer_dlpack_host():
    for err in run_ranks(2, "raw_buffer"):
        assert err is not None and err[0] == "InvalidUsageError" and "17" in err[1], err


def test_mscclpp_executor_plan_host():
    names = run_ranks(2, "executor_plan")
    assert len(names) == 2 and names[0] == names[1], names


def test_mscclpp_enums_match_mscclpp():
    from mscclpp_rs import mscclpp

    assert [(d.name, int(d)) for d in mscclpp.DataType][:5] == [
        ("int32", 0), ("uint32", 1), ("float16", 2), ("float32", 3), ("bfloat16", 4)]
    assert (int(mscclpp.ReduceOp.SUM), int(mscclpp.ReduceOp.MIN), int(mscclpp.ReduceOp.NOP)) == (0, 3, 255)
    assert mscclpp.is_nvls_supported() is False
    assert mscclpp.ext.AlgorithmCollectionBuilder() is mscclpp.ext.AlgorithmCollectionBuilder()


# --- which `mscclpp` a user gets ---------------------------------------------------------------

FAKE_INIT = "REAL_MSCCLPP = True\n"
FAKE_UTILS = textwrap.dedent("""
    from dataclasses import dataclass, field
    @dataclass(frozen=True)
    class AlgoSpec:
        name: str
        world_size: int = 2
        nranks_per_node: int = 2
        tags: dict = field(default_factory=dict)
""")
FAKE_COLLECTIVES = "class AllReduce:\n    def __init__(self, n, chunks, inplace):\n        self.n = n\n"
FAKE_ALGO = textwrap.dedent("""
    import json
    from mscclpp.language.collectives import AllReduce
    class _Prog:
        def __init__(self, spec): self.spec = spec
        def post_process_operations(self): self.done = True
        def to_json(self, **kw):
            assert self.done
            return json.dumps({"name": self.spec.name, "collective": "allreduce", "inplace": True,
                               "min_message_size": 1024, "max_message_size": 8 << 20, "gpus": []})
    def allreduce_multi_nodes(spec, thread_block_group_size=1):
        AllReduce(spec.world_size, 1, True)
        return _Prog(spec)
""")


@pytest.fixture()
def fake_real_mscclpp(tmp_path):
    """A stand-in for a real MSCCL++ install on sys.path (with a DSL: language/, default_algos/)."""
    pkg = tmp_path / "mscclpp"
    (pkg / "language").mkdir(parents=True)
    (pkg / "default_algos").mkdir()
    (pkg / "__init__.py").write_text(FAKE_INIT)
    (pkg / "language" / "__init__.py").write_text("from .utils import *\n")
    (pkg / "language" / "utils.py").write_text(FAKE_UTILS)
    (pkg / "language" / "collectives.py").write_text(FAKE_COLLECTIVES)
    (pkg / "default_algos" / "__init__.py").write_text(
        "from mscclpp.default_algos.allreduce_multi_nodes import allreduce_multi_nodes\n")
    (pkg / "default_algos" / "allreduce_multi_nodes.py").write_text(FAKE_ALGO)
    return tmp_path


def _py(code, path, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("MSCCLPP_RS", "MSCCLPP_DSL_PATH")}
    e.update(env)
    if path:
        e["PYTHONPATH"] = str(path)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True,
                       text=True, timeout=120, cwd=HERE)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


WHICH = "import mscclpp; print(getattr(mscclpp, 'IMPLEMENTATION', 'real'))"


def test_real_mscclpp_is_left_alone(fake_real_mscclpp):
    assert _py(WHICH, fake_real_mscclpp) == "real"
    # No real MSCCL++ and no opt-in: `import mscclpp` fails as it would without us.
    out = _py("try:\n    import mscclpp\n    print('imported')\nexcept ImportError:\n    print('none')", None)
    assert out == "none"


def test_opt_in_by_environment_over_a_real_mscclpp(fake_real_mscclpp):
    # The wheel's .pth installs ours at start-up: an unchanged program gets mscclpp_rs.
    assert _py(WHICH, fake_real_mscclpp, MSCCLPP_RS="1") == "mscclpp_rs"
    assert _py(WHICH, None, MSCCLPP_RS="1") == "mscclpp_rs"
    assert _py(WHICH, fake_real_mscclpp, MSCCLPP_RS="0") == "real"


def test_opt_in_in_code(fake_real_mscclpp):
    code = """
        import mscclpp_rs.compat
        mscclpp_rs.compat.install()
        import mscclpp, mscclpp.ext, mscclpp.default_algos
        print(mscclpp.IMPLEMENTATION, mscclpp.ext.__name__)
    """
    assert _py(code, fake_real_mscclpp) == "mscclpp_rs mscclpp_rs.mscclpp.ext"
    late = """
        import mscclpp, mscclpp_rs.compat
        try:
            mscclpp_rs.compat.install()
        except RuntimeError as e:
            print("refused:", "imported already" in str(e))
    """
    assert _py(late, fake_real_mscclpp) == "refused: True"


def test_dsl_from_a_real_mscclpp_runs_through_our_compile(fake_real_mscclpp):
    # SGLang's 16/32-rank path: mscclpp.language / default_algos are MSCCL++'s own (here the
    # fake's), mscclpp.compile is ours and keeps the plan's JSON for our executor.
    code = """
        import mscclpp, mscclpp.default_algos as d
        spec = mscclpp.language.AlgoSpec(name="ar2", tags={"default": 1})
        coll = mscclpp.language.collectives.AllReduce(2, 1, True)
        # SGLang compiles it once per thread-block-group size: the name must stay the function
        # after its module has been imported (the import binds the submodule on the package).
        for tbg in (1, 2):
            algo = mscclpp.compile(d.allreduce_multi_nodes, spec, 0, thread_block_group_size=tbg)
        print(algo.name, algo.message_size_range, algo.is_dsl_algorithm(),
              type(spec).__module__, type(coll).__module__)
    """
    out = _py(code, fake_real_mscclpp, MSCCLPP_RS="1")
    assert out == "ar2 (1024, 8388608) True mscclpp.language.utils mscclpp.language.collectives", out
    # Found through MSCCLPP_DSL_PATH too, with no real MSCCL++ on sys.path.
    out = _py(code, None, MSCCLPP_RS="1", MSCCLPP_DSL_PATH=str(fake_real_mscclpp / "mscclpp"))
    assert out.startswith("ar2 (1024, 8388608) True"), out


@pytest.mark.parametrize("per_host", [2, 4])
def test_dsl_multi_node_allreduce_across_simulated_hosts(per_host):
    """MSCCL++'s own allreduce_multi_nodes (MSCCLPP_DSL_PATH: its python/mscclpp, never
    shipped) compiled by our mscclpp.compile and executed on 2 simulated hosts."""
    dsl = os.environ.get("MSCCLPP_DSL_PATH")
    if not dsl or not os.path.isfile(os.path.join(dsl, "default_algos", "allreduce_multi_nodes.py")):
        pytest.skip("MSCCLPP_DSL_PATH names no MSCCL++ DSL with default_algos/allreduce_multi_nodes.py")
    import importlib.util
    if importlib.util.find_spec("sortedcontainers") is None:
        pytest.skip("sortedcontainers (MSCCL++'s DSL imports it) is not installed")
    size = 2 * per_host
    tag = f"dsl-hosts-{os.getpid()}-{per_host}"
    outs = run_ranks(size, "dsl_multi_node", env={"MSCCLPP_DSL_PATH": dsl},
                     rank_env=lambda r: {"MSCCLPP_HOSTID": f"{tag}-{r // per_host}"})
    for name, sizes in outs:
        assert name == "allreduce_2nodes" and len(sizes) == 2, (name, sizes)


def test_dsl_absent_says_why():
    code = """
        import mscclpp, mscclpp.default_algos as d   # SGLang imports it at start: must work
        try:
            d.allreduce_multi_nodes
        except ImportError as e:
            print("why:", "MSCCLPP_DSL_PATH" in str(e))
    """
    assert _py(code, None, MSCCLPP_RS="1") == "why: True"


# --- torch / GPU ------------------------------------------------------------------------------


def _torch_or_skip():
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("torch is not installed (the torch cases of the mscclpp API need it)")


def test_mscclpp_commgroup_torch_group_host():
    """CommGroup(torch_group=) over a Gloo group on the CPU (host backend), all-reduce by name."""
    _torch_or_skip()
    out = _py(f"""
        import sys; sys.path.insert(0, {HERE!r})
        import sglang_harness
        print(sglang_harness.commgroup_selftest(2))
    """, None, MSCCLPP_RS="1")
    assert out.endswith("ok"), out


def test_sglang_pymscclpp_unchanged():
    """SGLang's pymscclpp.py (path in SGLANG_PYMSCCLPP), unchanged, on one GPU per the harness."""
    _torch_or_skip()
    import torch

    path = os.environ.get("SGLANG_PYMSCCLPP")
    if not path:
        pytest.skip("SGLANG_PYMSCCLPP is not set (the path of SGLang's pymscclpp.py; not ours to ship)")
    if not torch.cuda.is_available():
        pytest.skip("SGLang's pymscclpp.py needs a CUDA device (torch sees none)")
    r = subprocess.run([sys.executable, os.path.join(HERE, "sglang_harness.py"), "--spawn", "2",
                        "--quick"], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, MSCCLPP_RS="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "harness: all-reduce correct" in r.stdout, r.stdout
