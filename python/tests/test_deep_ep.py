"""``mscclpp_rs.deep_ep`` (DeepEP's ``Buffer`` over the expert-parallel exchange): opt-in only, and
its calls against torch on the host backend (``deep_ep_ranks.py``; on a GPU the same script runs
with ``--device cuda``)."""

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _py(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("MSCCLPP_RS", "MSCCLPP_RS_DEEP_EP")}
    e.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                          capture_output=True, text=True, timeout=120, cwd=HERE)


def _has_torch():
    return _py("import torch").returncode == 0


def test_deep_ep_is_opt_in():
    # Without the opt-in, `import deep_ep` is not ours (DeepEP itself, or nothing).
    r = _py("import deep_ep; print(getattr(deep_ep, 'IMPLEMENTATION', 'real'))")
    assert r.returncode != 0 or r.stdout.strip() == "real", r.stdout + r.stderr
    r = _py("import deep_ep; print(deep_ep.IMPLEMENTATION)", MSCCLPP_RS_DEEP_EP="1")
    if _has_torch():
        assert r.returncode == 0 and r.stdout.strip() == "mscclpp_rs", r.stdout + r.stderr
    else:
        # Without torch the start-up hook says why, and nothing else breaks.
        assert "MSCCLPP_RS_DEEP_EP=1 but 'deep_ep' could not be installed" in r.stderr, r.stderr
        assert "torch" in r.stderr, r.stderr


def test_deep_ep_buffer_against_torch():
    if not _has_torch():
        pytest.skip("torch is not installed: mscclpp_rs.deep_ep serves torch tensors")
    r = subprocess.run([sys.executable, os.path.join(HERE, "deep_ep_ranks.py"), "--spawn", "2",
                        "--device", "cpu", "--tokens", "24", "--hidden", "128"],
                       capture_output=True, text=True, timeout=300, cwd=HERE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every check passed" in r.stdout, r.stdout + r.stderr


def test_deep_ep_buffer_internode_shapes_past_8_ranks():
    # 16 ranks on 2 simulated hosts of 8: DeepEP's internode layout (per-node counts) and handle
    # (recv_gbl_rank_prefix_sum at handle[-4]), the peers of the other host through the relay.
    if not _has_torch():
        pytest.skip("torch is not installed: mscclpp_rs.deep_ep serves torch tensors")
    r = subprocess.run([sys.executable, os.path.join(HERE, "deep_ep_ranks.py"), "--spawn", "16",
                        "--hosts", "2", "--device", "cpu", "--tokens", "24", "--hidden", "128",
                        "--experts", "32"],
                       capture_output=True, text=True, timeout=900, cwd=HERE)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "every check passed" in r.stdout, r.stdout[-4000:] + r.stderr[-4000:]


def test_harness_splits_its_options_from_the_tests():
    # DeepEP's own tests take their arguments after `--`; the harness's options may come after
    # the test's name and must not reach DeepEP's parser (they did once: `--nodes` was passed on
    # to test_internode.py, which refused it).
    sys.path.insert(0, HERE)
    try:
        import deep_ep_tests_harness as h
    finally:
        sys.path.remove(HERE)
    a, rest = h.parse(["internode", "--nodes", "3", "--backend", "mscclpp", "--",
                       "--num-processes", "8", "--", "x"])
    assert (a.test, a.nodes, a.backend) == ("internode", 3, "mscclpp")
    assert rest == ["--num-processes", "8", "--", "x"]
    a, rest = h.parse(["low_latency"])
    assert (a.test, a.nodes, a.backend, rest) == ("low_latency", 2, "nccl", [])
    for bad in (["internode", "--nodes", "1"], ["intranode", "--num-processes", "2"],
                ["nothing", "--", "x"]):
        with pytest.raises(SystemExit) as e:
            h.parse(bad)
        assert e.value.code == 2, bad

