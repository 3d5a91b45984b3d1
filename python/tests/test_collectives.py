"""Every collective, type and operator against NumPy on the host backend (2 and 3 ranks as
processes); the same through torch tensors on GPUs where torch and a GPU are present."""

import pytest

from cases import DTYPES, OPS

COUNTS = [1, 7, 1000, 70_001]


@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "outofplace"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce(host2, host3, dtype, op, inplace):
    for c in (host2, host3):
        c.run("all_reduce", dtype=dtype, op=op, counts=COUNTS, inplace=inplace)


def test_all_reduce_large(host2, host3):
    """Sizes past one LL round (1 MiB per peer) and past the LL range."""
    for c in (host2, host3):
        for op in ("sum", "max"):
            c.run("all_reduce", dtype="float32", op=op, counts=[300_000, 3_000_001], inplace=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather(host2, host3, dtype):
    for c in (host2, host3):
        c.run("all_gather", dtype=dtype, counts=COUNTS)


def test_all_gather_bool(host2, host3):
    for c in (host2, host3):
        c.run("bool_all_gather")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter(host2, host3, dtype, op):
    for c in (host2, host3):
        c.run("reduce_scatter", dtype=dtype, op=op, counts=COUNTS)


@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "outofplace"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast(host2, host3, dtype, inplace):
    for c in (host2, host3):
        for root in range(c.size):
            c.run("broadcast", dtype=dtype, root=root, counts=COUNTS, inplace=inplace)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all(host2, host3, dtype):
    for c in (host2, host3):
        c.run("all_to_all", dtype=dtype, counts=COUNTS)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float64"])
def test_send_recv_ring(host2, host3, dtype):
    for c in (host2, host3):
        c.run("ring", dtype=dtype, counts=COUNTS)


def test_send_recv_ping(host2, host3):
    for c in (host2, host3):
        c.run("ping", count=70_001)


def test_execute_plan(host2, host3):
    for c in (host2, host3):
        c.run("execute_plan", count=c.size * 1024)


@pytest.mark.parametrize("inplace_plan", [True, False], ids=["inplace_plan", "outofplace_plan"])
@pytest.mark.parametrize("same_array", [True, False], ids=["one_array", "two_arrays"])
def test_execute_plan_in_place_or_not(host2, inplace_plan, same_array):
    host2.run("execute_plan", count=2 * 1024, inplace_plan=inplace_plan, same_array=same_array)


def test_pairwise_batches_4_ranks(host4):
    # 1 float, one slot round, and messages of several rounds and lanes of the p2p kernel.
    host4.run("pairwise", dtype="float32", counts=[1, 10_000, 65_536, 300_001])


def test_rank_info(host2, host3):
    for c in (host2, host3):
        got = c.run("info")
        assert [g["rank"] for g in got] == list(range(c.size))
        assert all(g["size"] == c.size and g["backend"] == "host" for g in got)
        assert sorted(g["local_rank"] for g in got) == list(range(c.size))
        c.run("barrier")


# --- GPU: torch tensors (skipped without torch and a usable GPU) ----------------------------

GPU_DTYPES = ["float32", "float16", "bfloat16", "int32", "uint32", "float64", "int64", "uint8", "int8", "float8_e4m3fn", "float8_e5m2"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_all_reduce(gpu2, dtype, op):
    if op == "prod" and dtype == "uint32":
        pytest.skip("torch has no uint32 product on CUDA")
    for inplace in (True, False):
        gpu2.run("all_reduce", dtype=dtype, op=op, counts=COUNTS + [1 << 22], inplace=inplace, lib="torch")


@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_movement(gpu2, dtype):
    gpu2.run("all_gather", dtype=dtype, counts=COUNTS, lib="torch")
    gpu2.run("all_to_all", dtype=dtype, counts=COUNTS, lib="torch")
    gpu2.run("reduce_scatter", dtype=dtype, op="sum", counts=COUNTS, lib="torch")
    for root in (0, 1):
        gpu2.run("broadcast", dtype=dtype, root=root, counts=COUNTS, inplace=False, lib="torch")
    gpu2.run("ring", dtype=dtype, counts=COUNTS, lib="torch")


def test_gpu_graph(gpu2):
    gpu2.run("graph_all_reduce", count=1 << 20, replays=5)


def test_gpu_execute_plan(gpu2):
    gpu2.run("execute_plan", count=2 * 4096, lib="torch")


def test_gpu_register(gpu2):
    gpu2.run("registered_all_reduce", count=1 << 20)
