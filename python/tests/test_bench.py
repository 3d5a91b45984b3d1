"""``python -m mscclpp_rs.bench``: its arguments everywhere; on a GPU, a short run of ours alone
(``--ranks 2 --baseline none``, which ranks sharing one GPU can do) whose rows must all be there
and none of whose checks may find a wrong element."""

import os
import subprocess
import sys
import tempfile

import pytest

from mscclpp_rs import bench


def test_sizes_and_arguments():
    assert [bench._size(s) for s in ("1K", "64KiB", "1M", "1G", "4096", "1.5K")] == [
        1 << 10, 1 << 16, 1 << 20, 1 << 30, 4096, 1536,
    ]
    assert [bench._fmt(n) for n in (1 << 10, 1 << 20, 3 << 30, 1000)] == ["1K", "1M", "3G", "1000"]
    args = bench._parser().parse_args(["--ranks", "2", "--baseline", "none", "-b", "1K", "-e", "4K"])
    assert (args.ranks, args.baseline, args.min, args.max) == (2, "none", 1024, 4096)
    with pytest.raises(SystemExit):
        bench._parser().parse_args(["--baseline", "gloo"])
    with pytest.raises(SystemExit):
        bench._parser().parse_args(["-b", "lots"])


def _bench(*argv, timeout=300):
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return subprocess.run(
        [sys.executable, "-m", "mscclpp_rs.bench", *argv],
        capture_output=True, text=True, timeout=timeout, env=env,
        # Not the source folder, whose mscclpp_rs (no extension built in) would shadow the
        # installed package under ``python -m``.
        cwd=tempfile.gettempdir(),
    )


def test_too_few_ranks_is_refused_or_skipped():
    r = _bench("--ranks", "1", "--baseline", "none")
    out = r.stdout + r.stderr
    # Without torch and a GPU the benchmark skips before it reads --ranks; with them it refuses.
    assert ("skipped" in out and r.returncode == 0) or (
        r.returncode != 0 and "--ranks 1: the benchmark needs at least 2 ranks" in out
    ), out


def test_gpu_ours_alone_two_ranks():
    from conftest import _gpu_ranks

    n, why = _gpu_ranks()
    if not n:
        pytest.skip(f"GPU tests skipped: {why}")
    r = _bench("--ranks", "2", "--baseline", "none", "-b", "1K", "-e", "4M", "-f", "16", "-n", "5", "-w", "2")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    rows = [line.split() for line in r.stdout.splitlines() if line and not line.startswith(("#", " collective"))]
    rows = [row for row in rows if row[0] in ("allreduce", "allgather")]
    want = [(op, size) for size in ("1K", "16K", "256K", "4M") for op in ("allreduce", "allgather")]
    assert [(row[0], row[1]) for row in rows] == want, out
    assert "#wrong" not in out, out
    assert all(float(row[3]) > 0 for row in rows), out
