"""``mscclpp_rs.deep_ep`` (DeepEP's ``Buffer`` over the expert-parallel exchange): opt-in only, and
its calls against torch on the host backend (``deep_ep_ranks.py``; on a GPU the same script runs
with ``--device cuda``)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

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


def _harness():
    """python/tests/deep_ep_tests_harness.py as a module (it is a script beside this file)."""
    sys.path.insert(0, HERE)
    try:
        import deep_ep_tests_harness
    finally:
        sys.path.remove(HERE)
    return deep_ep_tests_harness


def test_harness_splits_its_options_from_the_tests():
    # DeepEP's own tests take their arguments after `--`; the harness's options may come after
    # the test's name and must not reach DeepEP's parser (they did once: `--nodes` was passed on
    # to test_internode.py, which refused it).
    h = _harness()
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


def test_harness_stops_a_node_after_it_printed_its_stacks():
    # When one node of DeepEP's internode test fails (or the harness is told to stop), the other
    # nodes print where their ranks were before they are stopped: a node here is a process
    # leading its own session, with a child that waits, as a node's ranks would.
    h = _harness()
    code = textwrap.dedent("""
        import faulthandler, signal, subprocess, sys, time
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        child = subprocess.Popen([sys.executable, "-c",
            "import faulthandler, signal, time\\n"
            "faulthandler.register(signal.SIGUSR1, all_threads=True)\\n"
            "import os\\n"
            "def rank_waits_here():\\n"
            "    print('ready', os.getpid(), flush=True)\\n"
            "    time.sleep(120)\\n"
            "rank_waits_here()\\n"], stdout=subprocess.PIPE, text=True)
        def node_waits_here():
            # "ready" once both wait in their functions.
            print(child.stdout.readline(), end="", flush=True)
            child.wait()
        node_waits_here()
    """)
    node = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ready, pid = node.stdout.readline().split()
        assert ready == "ready"
        started = time.monotonic()
        h.stop_nodes([node], "a test", grace=1.0)
        out, err = node.communicate(timeout=30)
    finally:
        if node.poll() is None:
            node.kill()
    assert time.monotonic() - started < 30
    assert node.returncode == -signal.SIGTERM, (node.returncode, err)
    # Both the node and its waiting child printed their stacks, naming where they waited.
    assert "node_waits_here" in err, err
    assert "rank_waits_here" in err, err
    # The child was stopped with its node (its session), not left behind (a zombie that no
    # one has reaped yet counts as stopped).
    def running():
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False
    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    if running():
        os.kill(int(pid), signal.SIGKILL)
        raise AssertionError("the node's child outlived it")
