"""Runs DeepEP's OWN tests (``tests/legacy/test_intranode.py``, ``test_low_latency.py``,
``test_internode.py`` of deepseek-ai/DeepEP) against ``mscclpp_rs.deep_ep``, UNCHANGED.

DeepEP's files are not ours and are not shipped: pass a checkout of DeepEP in ``DEEP_EP_SRC``.
Its tests import ``deep_ep`` (served by ``mscclpp_rs.deep_ep``) and ``deep_ep.utils`` (DeepEP's
test utilities: seeds, ``init_dist``, FP8 casts, ``bench``), which this harness loads from the
checkout by path; ``deep_ep.utils`` imports DeepEP's compiled extension ``deep_ep._C`` for its
event type and NCCL handles, which the harness stands in for (an event type; nothing else of
``_C`` is reached by the legacy tests). Two things of the test environment are the harness's,
not DeepEP's:

- ``init_dist``: DeepEP's puts rank r on ``cuda:r``; here every rank takes ``cuda:(r % device
  count)``, so that 2, 4 or 8 ranks can share one GPU. The process group is NCCL's, as DeepEP's
  is: under ``LD_PRELOAD`` of our ``libmscclpp_nccl.so`` (the real NCCL refuses two ranks on one
  GPU), or through ``--backend mscclpp`` (our PyTorch backend).
- the spawn: DeepEP's ``__main__`` block parses its own arguments (pass them after ``--``) and
  spawns ``test_loop``; the harness spawns a function of its own that sets the stand-ins up in
  each child, then calls the test module's ``test_loop`` with those arguments.
- the nodes of ``test_internode.py`` (8 ranks per node, 2 nodes or more): DeepEP runs its
  ``__main__`` once per node with ``WORLD_SIZE`` nodes and ``RANK`` the node's index; the harness
  starts one process per node (``--nodes``, default 2) on this machine, each a simulated host
  (``MSCCLPP_HOSTID`` per node), so that peers on other nodes are reached as across hosts.
  When a node fails, or the harness gets SIGTERM (``timeout``), every node still running first
  prints its processes' Python stacks (SIGUSR1, ``faulthandler``), then its whole session is
  stopped: a node that never reached a step says where its ranks waited.

    DEEP_EP_SRC=/path/to/DeepEP python tests/deep_ep_tests_harness.py intranode -- --num-processes 2
    DEEP_EP_SRC=... python tests/deep_ep_tests_harness.py low_latency -- --num-processes 2 --num-tokens 64
    DEEP_EP_SRC=... python tests/deep_ep_tests_harness.py internode --nodes 2 -- --num-processes 8

Exits 0 after printing ``harness: skip: <why>`` where torch, a GPU or the checkout is absent.
"""

import argparse
import faulthandler
import importlib
import importlib.util
import os
import runpy
import signal
import subprocess
import sys
import time
import types

TESTS = {"intranode": "test_intranode.py", "low_latency": "test_low_latency.py",
         "internode": "test_internode.py"}
# Set in the process of one node of test_internode.py (the harness's own child).
NODE_ENV = "DEEP_EP_HARNESS_NODE"


def _skip(why):
    print(f"harness: skip: {why}", flush=True)
    sys.exit(0)


def install(src, backend):
    """``deep_ep`` as ours, ``deep_ep.utils`` from DeepEP's checkout, ``deep_ep._C`` stood in
    for, and ``init_dist`` for ranks that share GPUs."""
    import torch
    import torch.distributed as dist

    import mscclpp_rs.compat

    mscclpp_rs.compat.install_deep_ep()
    import deep_ep

    class EventHandle:
        """The stand-in for ``deep_ep._C.EventHandle``: a CUDA event on the current stream."""

        def __init__(self):
            self.event = torch.cuda.Event()
            self.event.record()

        def current_stream_wait(self):
            torch.cuda.current_stream().wait_event(self.event)

    def not_served(name):
        if name.startswith("__"):
            raise AttributeError(name)

        def f(*args, **kwargs):
            raise NotImplementedError(f"deep_ep._C.{name}: DeepEP's compiled extension is not "
                                      "part of mscclpp_rs.deep_ep (the harness stands in for it)")
        return f

    c = types.ModuleType("deep_ep._C")
    c.EventHandle = EventHandle
    c.__getattr__ = not_served
    sys.modules["deep_ep._C"] = c
    deep_ep._C = c

    utils = os.path.join(src, "deep_ep", "utils")
    spec = importlib.util.spec_from_file_location(
        "deep_ep.utils", os.path.join(utils, "__init__.py"), submodule_search_locations=[utils])
    m = importlib.util.module_from_spec(spec)
    sys.modules["deep_ep.utils"] = m
    spec.loader.exec_module(m)
    deep_ep.utils = m
    envs = importlib.import_module("deep_ep.utils.envs")

    def init_dist(local_rank, num_local_ranks, seed=0):
        # DeepEP's settings (MASTER_ADDR/PORT, WORLD_SIZE nodes, RANK this node's index), its
        # default dtype and device and seed; the device is shared where there are fewer GPUs
        # than ranks, and each node is a simulated host.
        ip = os.getenv("MASTER_ADDR", "127.0.0.1")
        port = int(os.getenv("MASTER_PORT", "8361"))
        nodes, node = int(os.getenv("WORLD_SIZE", "1")), int(os.getenv("RANK", "0"))
        world, rank = nodes * num_local_ranks, node * num_local_ranks + local_rank
        if nodes > 1:
            os.environ["MSCCLPP_HOSTID"] = f"deep-ep-harness-{port}-{node}"
        dev = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(dev)
        if backend == "mscclpp":
            import mscclpp_rs.torch_backend  # noqa: F401  (registers the backend)
            be = "cuda:mscclpp"
        else:
            be = "nccl"
        extra = {"device_id": torch.device("cuda", dev)} if be == "nccl" else {}
        dist.init_process_group(backend=be, init_method=f"tcp://{ip}:{port}",
                                world_size=world, rank=rank, **extra)
        torch.set_default_dtype(torch.bfloat16)
        torch.set_default_device("cuda")
        envs._local_rank = local_rank
        envs.init_seed(seed)
        return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(world)))

    envs.init_dist = init_dist


def _dump_stacks_on_usr1():
    """SIGUSR1 prints every thread's Python stack to stderr and the process goes on: how a node
    that is stopped says where its ranks were."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def child(local_rank, src, test, backend, fn_name, fn_args):
    _dump_stacks_on_usr1()
    install(src, backend)
    sys.path.insert(0, os.path.join(src, "tests", "legacy"))
    mod = importlib.import_module(test[:-3])
    mod.init_dist = sys.modules["deep_ep.utils.envs"].init_dist
    getattr(mod, fn_name)(local_rank, *fn_args)


class _Stopped(Exception):
    pass


def _raise_stopped(signum, frame):
    raise _Stopped()


def stop_nodes(procs, why, grace=3.0):
    """Stops the node processes still running (each leads a session of its own, its ranks in
    it): first SIGUSR1, on which every process of the node prints its Python stacks, then after
    `grace` seconds SIGTERM to the whole session, so that no rank outlives its node."""
    alive = [p for p in procs if p.poll() is None]
    if not alive:
        return
    print(f"harness: {why}: the Python stacks of the nodes still running follow; then they are "
          "stopped", flush=True)
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGUSR1:
            time.sleep(grace)


def run_nodes(nodes):
    """test_internode.py: this script again once per node (``WORLD_SIZE``, ``RANK``), all at
    once; the first to fail stops the others, as does a SIGTERM to the harness (``timeout``),
    each node first printing where its ranks were. Returns the exit status."""
    procs = []
    for node in range(nodes):
        env = dict(os.environ, WORLD_SIZE=str(nodes), RANK=str(node), **{NODE_ENV: str(node)})
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env,
                                      start_new_session=True))
    status = 0
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.returncode not in (None, 0)]
            if failed:
                status = failed[0].returncode
                stop_nodes(procs, f"a node exited with {status}")
                break
            time.sleep(0.5)
    except _Stopped:
        status = 128 + signal.SIGTERM
        stop_nodes(procs, "the harness was told to stop")
    finally:
        signal.signal(signal.SIGTERM, previous)
    for p in procs:
        p.wait()
        status = status or p.returncode
    return status


def parse(argv):
    """(the harness's options, the test's own arguments): split at the first ``--`` by hand, as
    a REMAINDER positional would also swallow the harness's options given after the test's name
    (``internode --nodes 2 -- ...``); the parser's errors exit as argparse's do."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("test", choices=sorted(TESTS))
    p.add_argument("--backend", choices=["nccl", "mscclpp"], default="nccl",
                   help="the process group: NCCL's (our library preloaded) or ours")
    p.add_argument("--nodes", type=int, default=2,
                   help="internode: nodes of 8 ranks, each a simulated host (default 2)")
    cut = argv.index("--") if "--" in argv else len(argv)
    p.usage = p.format_usage().strip()[len("usage: "):] + " [-- the test's own arguments]"
    a = p.parse_args(argv[:cut])
    if a.test == "internode" and a.nodes < 2:
        p.error(f"--nodes {a.nodes}: DeepEP's internode test takes 2 nodes or more")
    return a, argv[cut + 1:]


def main():
    a, rest = parse(sys.argv[1:])
    src = os.environ.get("DEEP_EP_SRC")
    test = TESTS[a.test]
    path = src and os.path.join(src, "tests", "legacy", test)
    if not path or not os.path.isfile(path):
        _skip("DEEP_EP_SRC does not name a DeepEP checkout with tests/legacy/" + test)
    try:
        import torch
        import torch.multiprocessing as tmp
    except ImportError:
        _skip("torch is not installed (DeepEP's tests run on torch.cuda)")
    if not torch.cuda.is_available():
        _skip("torch sees no CUDA device (DeepEP's tests run on torch.cuda)")
    os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
    if NODE_ENV in os.environ:
        _dump_stacks_on_usr1()
    if a.test == "internode" and NODE_ENV not in os.environ:
        status = run_nodes(a.nodes)
        if status == 0:
            print(f"harness: {test}: every node finished", flush=True)
        sys.exit(status)

    real = tmp.spawn
    script = sys.modules["__main__"]

    def spawn(fn, args=(), nprocs=1, **kwargs):
        # DeepEP's __main__ spawns its test_loop: the harness's child stands in for it.
        print(f"harness: {test} {' '.join(rest)}: {nprocs} ranks, {a.backend} process group",
              flush=True)
        # By the harness's module name: while DeepEP's file runs as __main__, this script's
        # functions are not reachable as __main__'s in the children.
        # And with this script as __main__ again: a spawned child first re-runs the parent's
        # main file, which must not be DeepEP's (it imports deep_ep before any stand-in).
        import deep_ep_tests_harness as harness

        running, sys.modules["__main__"] = sys.modules["__main__"], script
        try:
            return real(harness.child, args=(src, test, a.backend, fn.__name__, tuple(args)),
                        nprocs=nprocs, **kwargs)
        finally:
            sys.modules["__main__"] = running

    install(src, a.backend)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.dirname(path))
    tmp.spawn = spawn
    sys.argv = [path] + rest
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        tmp.spawn = real
    print(f"harness: {test}: every rank finished", flush=True)


if __name__ == "__main__":
    main()
