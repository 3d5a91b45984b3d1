"""What the ranks run (see cluster.py): each case builds every rank's inputs from a seed, runs
one operation on this rank's part, and checks the result against NumPy, raising on a mismatch.

``lib`` is ``"numpy"`` (host backend) or ``"torch"`` (tensors on the communicator's GPU). Types
NumPy lacks travel as raw integers with ``dtype=``: bfloat16 as uint16, the float8 formats as
uint8.
"""

import os
import time

import numpy as np

import mscclpp_rs

FLOATS = ["float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2"]
INTS = ["int32", "uint32", "int64", "uint64", "int8", "uint8"]
DTYPES = FLOATS + INTS
OPS = ["sum", "prod", "min", "max", "avg"]

# Relative tolerance per type: exact for integers and wide floats (the inputs are multiples of
# 0.5 whose sums and products these types hold), a few roundings of the result otherwise.
RTOL = {"float32": 1e-6, "float64": 1e-12, "float16": 2e-3, "bfloat16": 2e-2, "float8_e4m3fn": 0.13, "float8_e5m2": 0.26}


def _fp8_table(e4m3):
    """The value of every float8 code (E4M3FN or E5M2)."""
    man_bits, bias = (3, 7) if e4m3 else (2, 15)
    out = np.empty(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp, man = (code & 0x7F) >> man_bits, code & ((1 << man_bits) - 1)
        if e4m3 and code & 0x7F == 0x7F:
            v = np.nan
        elif not e4m3 and exp == 31:
            v = np.inf if man == 0 else np.nan
        elif exp == 0:
            v = man / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            v = (1 + man / (1 << man_bits)) * 2.0 ** (exp - bias)
        out[code] = sign * v
    return out


FP8 = {"float8_e4m3fn": _fp8_table(True), "float8_e5m2": _fp8_table(False)}


def values(dtype, seed, rank, count):
    """Rank ``rank``'s input: small multiples of 0.5 (floats) or small integers."""
    rng = np.random.default_rng([seed, rank, count])
    if dtype in FLOATS:
        return rng.integers(-8, 9, count) / 2.0
    if dtype.startswith("u"):
        return rng.integers(0, 4, count).astype(np.float64)
    return rng.integers(-3, 4, count).astype(np.float64)


def reduce(op, arrays, dtype):
    a = np.stack(arrays)
    if op == "sum":
        return a.sum(0)
    if op == "prod":
        return a.prod(0)
    if op == "min":
        return a.min(0)
    if op == "max":
        return a.max(0)
    s = a.sum(0) / len(arrays)
    return s if dtype in FLOATS else np.trunc(s)


# --- arrays of either library ---------------------------------------------------------------


def _torch_dtype(dtype):
    import torch

    return getattr(torch, dtype)


def _device(comm):
    import torch

    torch.cuda.set_device(comm.device)
    return torch.device("cuda", comm.device)


def make(lib, comm, vals, dtype):
    """An array holding ``vals`` as ``dtype``, and the ``dtype=`` keyword the call needs."""
    if lib == "torch":
        import torch

        t = torch.tensor(vals, dtype=torch.float64).to(_torch_dtype(dtype)).to(_device(comm))
        if dtype in FP8:  # DLPack has no float8 in torch: the bytes travel as uint8
            return t.view(torch.uint8), dtype
        return t, None
    if dtype == "bfloat16":
        bits = np.asarray(vals, np.float32).view(np.uint32)
        return (bits >> 16).astype(np.uint16), "bfloat16"
    if dtype in FP8:
        table = FP8[dtype]
        codes = np.array([np.flatnonzero(table == v)[0] for v in vals], np.uint8)
        return codes, dtype
    return np.asarray(vals).astype(dtype), None


def poisoned(lib, comm, count, dtype):
    """An array of ``count`` elements, every one an impossible result (NaN, 111)."""
    fill = np.full(count, np.nan if dtype in FLOATS else 111.0)
    if lib == "numpy" and dtype in FP8:
        return np.full(count, 0x7F, np.uint8), dtype  # NaN in both formats
    if lib == "numpy" and dtype == "bfloat16":
        return np.full(count, 0x7FC0, np.uint16), dtype
    return make(lib, comm, fill, dtype)


def read(lib, arr, dtype):
    """The values of an array, as float64."""
    if lib == "torch":
        import torch

        if dtype in FP8:
            arr = arr.view(_torch_dtype(dtype))
        return arr.to(torch.float64).cpu().numpy()
    if dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype in FP8:
        return FP8[dtype][arr]
    return arr.astype(np.float64)


def check(what, got, want, dtype):
    rtol = RTOL.get(dtype, 0.0)
    # atol: a few roundings at the partial sums' magnitude (up to 4 per rank), where a result
    # near 0 can lose what a rounded partial sum dropped.
    bad = ~np.isclose(got, want, rtol=rtol, atol=8 * rtol)
    if bad.any():
        i = np.flatnonzero(bad)
        raise AssertionError(
            f"{what}: {len(i)} of {len(want)} wrong, first at {i[0]}: got {got[i[0]]}, "
            f"want {want[i[0]]}"
        )


def sync(lib):
    if lib == "torch":
        import torch

        torch.cuda.synchronize()


def guarded(lib, comm, count, dtype, guard=16):
    """A poisoned output of ``count`` elements inside a poisoned buffer of ``count + guard``."""
    buf, kw = poisoned(lib, comm, count + guard, dtype)
    return buf, buf[:count], kw


def check_guard(what, lib, buf, count, dtype):
    tail = read(lib, buf, dtype)[count:]
    poison_ok = np.isnan(tail) if dtype in FLOATS else tail == 111
    if not poison_ok.all():
        raise AssertionError(f"{what}: wrote past the end of its output: {tail}")


# --- cases ----------------------------------------------------------------------------------


def info(comm):
    return dict(rank=comm.rank, size=comm.size, backend=comm.backend, local_rank=comm.local_rank)


def all_reduce(comm, dtype, op, counts, inplace, lib="numpy", seed=0):
    n, r = comm.size, comm.rank
    for count in counts:
        ins = [values(dtype, seed, p, count) for p in range(n)]
        want = reduce(op, ins, dtype)
        x, kw = make(lib, comm, ins[r], dtype)
        if inplace:
            comm.all_reduce(x, op, dtype=kw)
            sync(lib)
            check(f"all_reduce {dtype} {op} {count} in place", read(lib, x, dtype), want, dtype)
        else:
            buf, out, _ = guarded(lib, comm, count, dtype)
            got = comm.all_reduce(x, op, out=out, dtype=kw)
            assert got is out
            sync(lib)
            check(f"all_reduce {dtype} {op} {count}", read(lib, out, dtype), want, dtype)
            check(f"all_reduce {dtype} {op} input", read(lib, x, dtype), ins[r], dtype)
            check_guard("all_reduce", lib, buf, count, dtype)


def all_gather(comm, dtype, counts, lib="numpy", seed=1):
    n, r = comm.size, comm.rank
    for count in counts:
        ins = [values(dtype, seed, p, count) for p in range(n)]
        x, kw = make(lib, comm, ins[r], dtype)
        buf, out, _ = guarded(lib, comm, n * count, dtype)
        comm.all_gather(out, x, dtype=kw)
        sync(lib)
        check(f"all_gather {dtype} {count}", read(lib, out, dtype), np.concatenate(ins), dtype)
        check_guard("all_gather", lib, buf, n * count, dtype)


def reduce_scatter(comm, dtype, op, counts, lib="numpy", seed=2):
    n, r = comm.size, comm.rank
    for count in counts:
        ins = [values(dtype, seed, p, n * count) for p in range(n)]
        want = reduce(op, [a[r * count : (r + 1) * count] for a in ins], dtype)
        x, kw = make(lib, comm, ins[r], dtype)
        buf, out, _ = guarded(lib, comm, count, dtype)
        comm.reduce_scatter(out, x, op, dtype=kw)
        sync(lib)
        check(f"reduce_scatter {dtype} {op} {count}", read(lib, out, dtype), want, dtype)
        check_guard("reduce_scatter", lib, buf, count, dtype)


def broadcast(comm, dtype, root, counts, inplace, lib="numpy", seed=3):
    r = comm.rank
    for count in counts:
        want = values(dtype, seed, root, count)
        mine = want if r == root else values(dtype, seed + 100, r, count)
        x, kw = make(lib, comm, mine, dtype)
        if inplace:
            comm.broadcast(x, root, dtype=kw)
            sync(lib)
            check(f"broadcast {dtype} root {root} {count} in place", read(lib, x, dtype), want, dtype)
        else:
            buf, out, _ = guarded(lib, comm, count, dtype)
            comm.broadcast(x, root, out=out, dtype=kw)
            sync(lib)
            check(f"broadcast {dtype} root {root} {count}", read(lib, out, dtype), want, dtype)
            check_guard("broadcast", lib, buf, count, dtype)


def all_to_all(comm, dtype, counts, lib="numpy", seed=4):
    n, r = comm.size, comm.rank
    for count in counts:
        ins = [values(dtype, seed, p, n * count) for p in range(n)]
        want = np.concatenate([a[r * count : (r + 1) * count] for a in ins])
        x, kw = make(lib, comm, ins[r], dtype)
        buf, out, _ = guarded(lib, comm, n * count, dtype)
        comm.all_to_all(out, x, dtype=kw)
        sync(lib)
        check(f"all_to_all {dtype} {count}", read(lib, out, dtype), want, dtype)
        check_guard("all_to_all", lib, buf, n * count, dtype)


def bool_all_gather(comm):
    n, r = comm.size, comm.rank
    x = np.array([True, False, r % 2 == 0])
    out = np.zeros(3 * n, bool)
    comm.all_gather(out, x)
    want = np.concatenate([[True, False, p % 2 == 0] for p in range(n)])
    assert (out == want).all(), (out, want)


def ring(comm, dtype, counts, lib="numpy", seed=5):
    """Every rank sends to the next and receives from the previous, in one group."""
    n, r = comm.size, comm.rank
    for count in counts:
        x, kw = make(lib, comm, values(dtype, seed, r, count), dtype)
        buf, out, _ = guarded(lib, comm, count, dtype)
        with comm.group():
            comm.send(x, (r + 1) % n)
            comm.recv(out, (r - 1) % n)
        sync(lib)
        check(f"ring {dtype} {count}", read(lib, out, dtype), values(dtype, seed, (r - 1) % n, count), dtype)
        check_guard("ring", lib, buf, count, dtype)


def pairwise(comm, dtype, counts, lib="numpy", seed=11):
    """One group in which every rank sends a message to every other rank and receives one from
    each (the all-to-all-v of batch_isend_irecv), at sizes of one and of several rounds of the
    point-to-point slots; every receive checked, its guard bands untouched."""
    n, r = comm.size, comm.rank
    for count in counts:
        xs, outs = {}, {}
        for p in range(n):
            if p == r:
                continue
            xs[p], _ = make(lib, comm, values(dtype, seed + 31 * p, r, count), dtype)
            outs[p] = guarded(lib, comm, count, dtype)
        with comm.group():
            for p in xs:
                comm.send(xs[p], p)
                comm.recv(outs[p][1], p)
        sync(lib)
        for p, (buf, out, _) in outs.items():
            want = values(dtype, seed + 31 * r, p, count)
            check(f"pairwise {dtype} {count} from {p}", read(lib, out, dtype), want, dtype)
            check_guard(f"pairwise from {p}", lib, buf, count, dtype)


def ping(comm, count, lib="numpy"):
    """Rank 0 sends to rank 1 and gets it back, one operation at a time (no group)."""
    r = comm.rank
    x, _ = make(lib, comm, values("float32", 6, 0, count), "float32")
    if r == 0:
        comm.send(x, 1)
        back, _ = poisoned(lib, comm, count, "float32")
        comm.recv(back, 1)
        sync(lib)
        check("ping back", read(lib, back, "float32"), values("float32", 6, 0, count), "float32")
    elif r == 1:
        got, _ = poisoned(lib, comm, count, "float32")
        comm.recv(got, 0)
        comm.send(got, 0)
        sync(lib)
        check("ping", read(lib, got, "float32"), values("float32", 6, 0, count), "float32")


def barrier(comm):
    comm.barrier()


def bad_call(comm, which):
    """Makes a wrong call (the same on every rank) and reports the exception."""
    f32 = np.zeros(8, np.float32)
    calls = {
        "op": lambda: comm.all_reduce(f32, "median"),
        "sizes": lambda: comm.all_gather(np.zeros(8, np.float32), np.zeros(3, np.float32)),
        "dtypes": lambda: comm.all_reduce(f32, out=np.zeros(8, np.float64)),
        "dtype_size": lambda: comm.all_reduce(f32, dtype="float16"),
        "dtype_name": lambda: comm.all_reduce(f32, dtype="complex32"),
        "not_contiguous": lambda: comm.all_reduce(np.zeros((4, 4), np.float32)[:, 1]),
        "not_an_array": lambda: comm.all_reduce([1.0, 2.0]),
        "root": lambda: comm.broadcast(f32, root=comm.size),
        "peer": lambda: comm.send(f32, comm.size + 3),
        "stream": lambda: comm.all_reduce(f32, stream=1234),
        "bool_reduce": lambda: comm.all_reduce(np.zeros(4, bool)),
        "int16": lambda: comm.all_reduce(np.zeros(4, np.int16)),
        "alltoall_blocks": lambda: comm.all_to_all(np.zeros(comm.size * 2 + 1, np.float32), np.zeros(comm.size * 2 + 1, np.float32)),
        "plan_json": lambda: comm.execute_plan('{"name": "x"}', f32, np.zeros(8, np.float32)),
        "plan_path": lambda: comm.execute_plan("/nonexistent/plan.json", f32, np.zeros(8, np.float32)),
        "register_host": lambda: comm.register(f32),
        "readonly": lambda: comm.all_reduce(np.frombuffer(b"\0" * 32, np.float32)),
    }
    try:
        calls[which]()
    except Exception as e:
        return [c.__name__ for c in type(e).__mro__], str(e)
    raise AssertionError(f"{which}: no exception")


def die(comm, rank):
    """Rank ``rank`` exits without a word (a crash)."""
    if comm.rank == rank:
        os._exit(3)


def all_reduce_expecting_failure(comm):
    x = np.ones(1 << 16, np.float32)
    try:
        comm.all_reduce(x)
    except mscclpp_rs.Error as e:
        return [c.__name__ for c in type(e).__mro__], str(e)
    raise AssertionError("all_reduce with a dead peer returned normally")


def allreduce_plan(n, inplace=False):
    """MSCCL++'s JSON plan format: an all-reduce of ``n`` ranks in the Simple protocol (each rank
    reduces its chunk by reading every peer's input and writes the result into every output,
    between signal/wait rounds; in place, the input is the output, as in MSCCL++'s in-place
    plans); executor/src/testgen.rs's allreduce_simple."""
    out = "i" if inplace else "o"
    gpus = []
    for r in range(n):
        ps = [p for p in range(n) if p != r]
        k = len(ps)
        remote = [{"rank": p, "type": "i", "access_channel_types": ["memory"]} for p in ps]
        if not inplace:
            remote += [{"rank": p, "type": "o", "access_channel_types": ["memory"]} for p in ps]
        src = [{"type": "i", "index": r, "size": 1}] + [
            {"buffer_id": j, "index": r, "size": 1} for j in range(k)
        ]
        dst = [{"type": out, "index": r, "size": 1}] + [
            {"buffer_id": j if inplace else k + j, "index": r, "size": 1} for j in range(k)
        ]
        sync_ops = [
            {"name": "signal", "channel_type": "memory", "channel_ids": list(range(k))},
            {"name": "wait", "channel_type": "memory", "channel_ids": list(range(k))},
        ]
        ops = sync_ops + [
            {"name": "rres", "channel_type": "memory", "reduce_op": "sum", "src_buff": src, "dst_buff": dst},
            {"name": "nop"},
        ] + sync_ops
        gpus.append({
            "id": r, "input_chunks": n, "output_chunks": 0 if inplace else n, "scratch_chunks": 0,
            "channels": [{"channel_type": "memory", "connected_to": ps}],
            "remote_buffers": remote, "semaphores": [],
            "threadblocks": [{
                "id": 0, "ops": ops,
                "channels": [{"channel_type": "memory", "channel_ids": list(range(k))}],
                "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": list(range(len(remote)))}],
            }],
        })
    return {
        "name": f"allreduce_simple_{n}{'_ip' if inplace else ''}", "collective": "allreduce", "protocol": "Simple",
        "inplace": inplace, "reuse_resources": False, "num_threads_per_block": 1024,
        "use_double_scratch_buffer": False, "buffer_alignment": 16, "min_message_size": 0,
        "max_message_size": 2**64 - 1, "gpus": gpus,
    }


def execute_plan(comm, count, lib="numpy", seed=7, repeat=3, inplace_plan=False, same_array=False):
    """A plan (in place or not, as its JSON says) with two distinct arrays or one: correct
    either way, and a distinct input left as it was."""
    import json

    n, r = comm.size, comm.rank
    plan = json.dumps(allreduce_plan(n, inplace_plan))
    for i in range(repeat):
        ins = [values("float32", seed + i, p, count) for p in range(n)]
        x, _ = make(lib, comm, ins[r], "float32")
        if same_array:
            out = x
        else:
            out, _ = poisoned(lib, comm, count, "float32")
        comm.execute_plan(plan, x, out)
        sync(lib)
        what = f"plan (in place: {inplace_plan}, one array: {same_array}) run {i}"
        check(what, read(lib, out, "float32"), reduce("sum", ins, "float32"), "float32")
        if not same_array:
            check(what + ": its input", read(lib, x, "float32"), ins[r], "float32")


def graph_all_reduce(comm, count, replays):
    """An all-reduce captured in a CUDA graph on torch's capture stream, replayed with new
    inputs: no host synchronisation inside, flags advanced by the kernels."""
    import torch

    dev = _device(comm)
    x = torch.zeros(count, dtype=torch.float32, device=dev)
    out = torch.zeros_like(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (set-up, kernel loading)
        comm.all_reduce(x, out=out)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        comm.all_reduce(x, out=out)
    for i in range(replays):
        ins = [values("float32", 50 + i, p, count) for p in range(comm.size)]
        x.copy_(torch.from_numpy(ins[comm.rank]).to(dev))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check(f"graph replay {i}", out.double().cpu().numpy(), reduce("sum", ins, "float32"), "float32")


def registered_all_reduce(comm, count):
    import torch

    dev = _device(comm)
    # A view at an offset into a larger tensor: the peers map the caching allocator's whole
    # segment and must read exactly this range of it.
    whole = torch.zeros(count + 2048, dtype=torch.float32, device=dev)
    x = whole[1024 : 1024 + count]
    reg = comm.register(x)
    zero_copy = comm.zero_copy_calls
    out = torch.zeros_like(x)
    for i in range(3):
        ins = [values("float32", 60 + i, p, count) for p in range(comm.size)]
        x.copy_(torch.from_numpy(ins[comm.rank]).to(dev))
        out.fill_(float("nan"))
        comm.all_reduce(x, out=out)
        torch.cuda.synchronize()
        check(f"registered {i}", out.double().cpu().numpy(), reduce("sum", ins, "float32"), "float32")
    # 4 MiB in all is inside the range where reading in place pays: every call was zero copy.
    assert comm.zero_copy_calls - zero_copy == 3, (zero_copy, comm.zero_copy_calls)
    comm.barrier()
    comm.deregister(reg)
    assert not reg.registered


# --- channels, semaphores and compiled kernels -------------------------------------------------

import ctypes  # noqa: E402
import struct  # noqa: E402

#: Bytes of the device handles (kernels/include/mscclpp/*.cuh, hal/src/dev/*.rs).
HANDLE_SIZES = {"memory_semaphore": 32, "base_channel": 32, "host_semaphore": 16,
                "memory_channel": 56, "port_channel": 64}


def channel_handles(comm, nbytes=4096):
    """Builds every channel and semaphore with the other rank (2 ranks) on the host backend and
    checks their handles: sizes, stability, and the addresses they carry. On the host backend
    device addresses are addresses of this process, so the test also moves data and signals
    through them with ctypes: what a kernel would do."""
    peer = 1 - comm.rank
    sem = comm.memory_semaphore(peer)
    hsem = comm.host_semaphore(peer)
    send, recv, packets = comm.alloc(nbytes), comm.alloc(nbytes), comm.alloc(256)
    mc = comm.memory_channel(peer, send, recv, packet_buffer=packets)
    mc_plain = comm.memory_channel(peer, send, recv)
    pc = comm.port_channel(peer, send, recv, transport="Ethernet")
    got = {"memory_semaphore": sem.device_handle(), "base_channel": sem.channel_handle(),
           "host_semaphore": hsem.device_handle(), "memory_channel": mc.device_handle(),
           "port_channel": pc.device_handle()}
    for k, h in got.items():
        assert isinstance(h, bytes) and len(h) == HANDLE_SIZES[k], (k, len(h))
    assert sem.device_handle() == got["memory_semaphore"] and mc.device_handle() == got["memory_channel"]
    assert pc.device_handle() == got["port_channel"]
    assert sem.peer == hsem.peer == mc.peer == pc.peer == peer
    assert (mc.src_nbytes, mc.dst_nbytes) == (nbytes, nbytes)
    # A base channel is its semaphore's handle.
    assert got["base_channel"] == got["memory_semaphore"]
    inbound, outbound, remote_inbound, expected = struct.unpack("<4Q", got["memory_semaphore"])
    assert outbound == inbound + 8 and expected == inbound + 16 and remote_inbound not in (0, inbound)
    dst, src, pkt = struct.unpack("<3Q", got["memory_channel"][32:])
    assert src == send.ptr and pkt == packets.ptr and dst not in (0, recv.ptr)
    assert struct.unpack("<3Q", mc_plain.device_handle()[32:])[2] == 0  # no packet buffer
    sem_id, dst_id, src_id, _ = struct.unpack("<4I", got["port_channel"][:16])
    assert (sem_id, dst_id, src_id) == (0, 0, 1)
    p_inbound, p_expected = struct.unpack("<2Q", got["port_channel"][16:32])
    assert p_expected == p_inbound + 16  # the channel's own host-to-device semaphore
    # A put through the channel's mapping of the peer's `recv`, then a host signal: the peer
    # sees the bytes in its `recv` and the token in its host semaphore's inbound word.
    mine = bytes((comm.rank * 7 + i) % 251 for i in range(nbytes))
    comm.barrier()
    ctypes.memmove(dst, mine, nbytes)
    hsem.signal()
    comm.barrier()
    theirs = bytes((peer * 7 + i) % 251 for i in range(nbytes))
    assert recv.read() == theirs
    assert recv.read(8, 16) == theirs[8:24]
    # A host signal travels on the connection (Ethernet here), not with the barrier: wait for
    # it as a kernel would, with a deadline.
    h_inbound, _ = struct.unpack("<2Q", got["host_semaphore"])
    deadline = time.monotonic() + 10
    while ctypes.c_uint64.from_address(h_inbound).value == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert ctypes.c_uint64.from_address(h_inbound).value == 1
    # A device-to-device signal: store into the peer's inbound token, as `signal()` does.
    ctypes.c_uint64.from_address(remote_inbound).value = 5
    comm.barrier()
    assert ctypes.c_uint64.from_address(inbound).value == 5
    pc.stop()
    pc.stop()  # twice is fine
    comm.barrier()
    return list(got.values())


def bad_channel_call(comm, which):
    """Makes a wrong channel or kernel call (the same on every rank); reports the exception."""
    peer = 1 - comm.rank
    buf = comm.alloc(64)
    calls = {
        "peer_self": lambda: comm.memory_semaphore(comm.rank),
        "peer_range": lambda: comm.memory_channel(comm.size + 1, buf, buf),
        "numpy_on_host": lambda: comm.memory_channel(peer, np.zeros(16, np.float32), buf),
        "transport": lambda: comm.host_semaphore(peer, transport="carrier-pigeon"),
        "fifo_size": lambda: comm.port_channel(peer, buf, buf, fifo_size=3),
        "alloc_zero": lambda: comm.alloc(0),
        "read_range": lambda: buf.read(60, 8),
        "write_range": lambda: buf.write(b"x" * 65),
        "compile_host": lambda: comm.compile_kernel("extern \"C\" __global__ void k() {}", "k"),
        "compile_module_host": lambda: mscclpp_rs.compile_kernel("__global__ void k() {}", "k", device=comm),
    }
    try:
        calls[which]()
    except Exception as e:
        return [c.__name__ for c in type(e).__mro__], str(e)
    raise AssertionError(f"{which}: no exception")


PING_PONG = r"""
#include "mscclpp/memory_channel.cuh"

// Plain C types: the headers' fixed-width ones live in namespace mscclpp (no <cstdint> here).
typedef unsigned long long u64;
typedef unsigned int u32;

struct Args {
  mscclpp::MemoryChannelDeviceHandle ch;  // 56 bytes: the channel's device_handle()
  u64 recv;     // this rank's recv (where the peer's puts land)
  u64 rounds;
  u64 count;    // int32 elements of send and recv
  u64 errors;   // device address of an int32 counter
  u32 rank;
  u32 pad;
};

// Round r: rank 0 puts r * 1000 + i into rank 1's recv and signals; rank 1 waits, puts every
// value plus one into rank 0's recv and signals back; rank 0 waits and counts wrong answers.
extern "C" __global__ void ping_pong(Args a) {
  int* send = (int*)a.ch.src;
  const volatile int* recv = (const volatile int*)a.recv;
  const u32 tid = threadIdx.x, nt = blockDim.x;
  for (u64 r = 0; r < a.rounds; ++r) {
    if (a.rank == 1) {
      if (tid == 0) a.ch.wait();
      __syncthreads();
      for (u64 i = tid; i < a.count; i += nt) send[i] = recv[i] + 1;
    } else {
      for (u64 i = tid; i < a.count; i += nt) send[i] = (int)(r * 1000 + i);
    }
    __syncthreads();
    a.ch.put(0, a.count * 4, tid, nt);
    __syncthreads();
    if (tid == 0) {
      __threadfence_system();
      a.ch.signal();
    }
    if (a.rank == 0) {
      if (tid == 0) a.ch.wait();
      __syncthreads();
      for (u64 i = tid; i < a.count; i += nt)
        if (recv[i] != (int)(r * 1000 + i + 1)) atomicAdd((int*)a.errors, 1);
      __syncthreads();
    }
  }
}
"""


def gpu_ping_pong(comm, rounds, count, tensors=False):
    """A kernel compiled from the string above ping-pongs over a memory channel for ``rounds``
    rounds; rank 0 counts wrong answers on the device, both check the last data here. With
    ``tensors``, both channel buffers are torch tensors (the peer maps the torch allocator's
    segment behind ``recv``), else ``alloc()`` buffers."""
    import torch

    dev = _device(comm)
    peer = 1 - comm.rank
    if tensors:
        send = torch.zeros(count, dtype=torch.int32, device=dev)
        recv = torch.full((count,), -1, dtype=torch.int32, device=dev)  # poison
        send_ptr, recv_ptr = send.data_ptr(), recv.data_ptr()
    else:
        send, recv = comm.alloc(count * 4), comm.alloc(count * 4)
        recv.write(b"\xff" * (count * 4))  # poison: -1 everywhere
        send_ptr, recv_ptr = send.ptr, recv.ptr
    errors = torch.zeros(1, dtype=torch.int32, device=dev)
    torch.cuda.synchronize()
    ch = comm.memory_channel(peer, send, recv)
    handle = ch.device_handle()
    assert len(handle) == 56 and struct.unpack("<Q", handle[40:48])[0] == send_ptr
    args = handle + struct.pack("<QQQQII", recv_ptr, rounds, count, errors.data_ptr(), comm.rank, 0)
    assert len(args) == 96
    kernel = comm.compile_kernel(PING_PONG, "ping_pong", arg_size=len(args))
    comm.barrier()
    stream = torch.cuda.current_stream().cuda_stream
    kernel.launch(1, 256, args, stream=stream)
    kernel.synchronize(stream=stream, timeout=120)
    last = rounds - 1
    want = [last * 1000 + i + (1 if comm.rank == 0 else 0) for i in range(count)]
    got = recv.cpu().tolist() if tensors else list(struct.unpack(f"<{count}i", recv.read()))
    assert got == want, f"rank {comm.rank}: recv after {rounds} rounds: {got[:4]}... want {want[:4]}..."
    assert errors.item() == 0, f"rank 0 saw {errors.item()} wrong answers"
    with pytest_raises_usage():
        kernel.launch(1, 256, args[:-8], stream=stream)  # not the compiled arg_size
    comm.barrier()
    return rounds


class pytest_raises_usage:
    """``pytest.raises(InvalidUsageError)`` without pytest in the rank processes."""

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise AssertionError("expected an InvalidUsageError")
        return issubclass(kind, mscclpp_rs.InvalidUsageError)


def expert_exchange(comm, experts_per_rank, topk, hidden, tokens, seed=11):
    """The expert-parallel exchange against NumPy: the layout of a random top-k routing (with -1
    entries), dispatch (rows, local experts, weights, source indices, counts) and combine (the
    expert outputs, each rank's rows times rank + 1, summed back in float32 in rank order)."""
    n, r = comm.size, comm.rank
    experts = experts_per_rank * n
    ex = comm.expert_exchange(experts, topk, max(tokens), hidden * 4)
    assert (ex.num_experts, ex.local_experts, ex.topk) == (experts, experts_per_rank, topk)

    def routing(p):
        rng = np.random.default_rng(seed * 1000 + p)
        t = tokens[p % len(tokens)]
        idx = np.array([rng.permutation(experts)[:topk] for _ in range(t)], np.int64).reshape(t, topk)
        idx[rng.random(idx.shape) < 0.125] = -1
        x = rng.standard_normal((t, hidden)).astype(np.float32)
        w = (rng.random((t, topk)) + 0.5).astype(np.float32)
        return idx, x, w

    data = [routing(p) for p in range(n)]
    idx, x, w = data[r]
    t = len(idx)
    owner = lambda e: e // experts_per_rank  # noqa: E731

    per_rank, per_expert = np.zeros(n, np.int32), np.zeros(experts, np.int32)
    in_rank, status = np.zeros((t, n), np.uint8), np.zeros(1, np.int32)
    ex.layout(idx, per_rank, per_expert, in_rank, status)
    want_in = np.zeros((t, n), np.uint8)
    for i, e in zip(*np.nonzero(idx >= 0)):
        want_in[i, owner(idx[i, e])] = 1
    valid = idx[idx >= 0]
    assert (in_rank == want_in).all() and status[0] == 0
    assert (per_rank == want_in.sum(0)).all(), (per_rank, want_in.sum(0))
    assert (per_expert == np.bincount(valid, minlength=experts)).all()

    cap = n * max(tokens)
    out_x = np.full((cap, hidden), np.nan, np.float32)
    out_idx = np.full((cap, topk), -7, np.int64)
    out_w = np.full((cap, topk), np.nan, np.float32)
    out_src = np.full(cap, -7, np.int32)
    handle = np.zeros(ex.handle_bytes, np.uint8)
    ex.dispatch(x, idx, out_x, out_idx, out_src, handle, topk_weights=w, out_weights=out_w)
    per_source, per_local = ex.received(handle)
    rows = [(p, i) for p in range(n) for i in range(len(data[p][0]))
            if any(e >= 0 and owner(e) == r for e in data[p][0][i])]
    assert per_source == [sum(1 for q, _ in rows if q == p) for p in range(n)], per_source
    want_local = [0] * experts_per_rank
    for j, (p, i) in enumerate(rows):
        pidx, px, pw = data[p]
        assert (out_x[j] == px[i]).all(), f"row {j}: token {i} of rank {p}"
        assert out_src[j] == i
        for k in range(topk):
            e = pidx[i, k]
            mine = e >= 0 and owner(e) == r
            assert out_idx[j, k] == (e - r * experts_per_rank if mine else -1)
            assert out_w[j, k] == (pw[i, k] if mine else 0.0)
            if mine:
                want_local[e - r * experts_per_rank] += 1
    assert per_local == want_local, (per_local, want_local)
    assert np.isnan(out_x[len(rows):]).all() and (out_src[len(rows):] == -7).all()

    got = len(rows)
    y = out_x[:got] * np.float32(r + 1)
    comb = np.full((max(t, 1), hidden), np.nan, np.float32)[:t]
    comb_w = np.full((max(t, 1), topk), np.nan, np.float32)[:t]
    ex.combine(y, handle, comb, hidden=hidden, topk_weights=out_w[:got].copy(), out_weights=comb_w)
    for i in range(t):
        acc = np.zeros(hidden, np.float32)
        for d in range(n):
            if want_in[i, d]:
                acc = acc + x[i] * np.float32(d + 1)
        assert (comb[i] == acc).all(), f"token {i} combined wrong: {comb[i][:4]} vs {acc[:4]}, x {x[i][:4]}, ranks {want_in[i]}"
        assert (comb_w[i] == np.where(idx[i] >= 0, w[i], 0)).all(), (comb_w[i], w[i])

    # Bad input: named, before anything runs.
    try:
        ex.dispatch(x, idx.astype(np.int32), out_x, out_idx, out_src, handle)
        raise AssertionError("an int32 routing was accepted")
    except ValueError as e:
        assert "int64" in str(e), e
    return got


def expert_exchange_expert_major(comm, experts_per_rank, topk, hidden, tokens, split, seed=13):
    """The expert-major ("low-latency") form against NumPy: the per-expert layout (rows, source
    tokens, ranges, counts, stats added to), then the combine (each expert's output weighed by the
    source's weight and summed; values and weights dyadic, so every sum is exact). With ``split``
    each call runs as a send half and then a receive half."""
    n, r = comm.size, comm.rank
    experts, local = experts_per_rank * n, experts_per_rank
    m = max(tokens)
    ex = comm.expert_exchange(experts, topk, m, hidden * 4)
    assert ex.expert_major and ex.slots_bytes == 4 * n * m * topk

    def routing(p):
        rng = np.random.default_rng(seed * 1000 + p)
        t = tokens[p % len(tokens)]
        idx = np.array([rng.permutation(experts)[:topk] for _ in range(t)], np.int64).reshape(t, topk)
        idx[rng.random(idx.shape) < 0.125] = -1
        x = (rng.integers(-32, 33, (t, hidden)) / 8).astype(np.float32)
        w = (rng.integers(1, 17, (t, topk)) / 8).astype(np.float32)
        return idx, x, w

    data = [routing(p) for p in range(n)]
    idx, x, w = data[r]
    t, cap = len(idx), n * m
    halves = ("send", "receive") if split else ("both",)
    recv_x = np.full((local, cap, hidden), np.nan, np.float32)
    src = np.full((local, cap), -7, np.int32)
    ranges = np.zeros((local, n), np.int64)
    count = np.full(local, -7, np.int32)
    stats = np.ones(local, np.int32)
    slots = np.zeros(ex.slots_bytes, np.uint8)
    handle = np.zeros(ex.handle_bytes, np.uint8)
    for h in halves:
        ex.dispatch_expert_major(x, idx, recv_x, src, ranges, count, slots, handle, stats=stats,
                                 half=h)
    for e in range(local):
        glob = r * local + e
        entries = [(p, i) for p in range(n) for i in range(len(data[p][0]))
                   if glob in data[p][0][i]]
        assert count[e] == len(entries) and stats[e] == 1 + len(entries), (e, count[e], entries)
        begin = 0
        for p in range(n):
            c = sum(1 for q, _ in entries if q == p)
            assert ranges[e, p] == (begin << 32) | c, (e, p, ranges[e, p])
            begin += c
        for j, (p, i) in enumerate(entries):
            assert (recv_x[e, j] == data[p][1][i]).all() and src[e, j] == i, (e, j)
        assert np.isnan(recv_x[e, len(entries):]).all() and (src[e, len(entries):] == -7).all()

    y = recv_x * np.arange(1, local + 1, dtype=np.float32).reshape(local, 1, 1)
    y = np.nan_to_num(y)
    out = np.full((max(t, 1), hidden), np.nan, np.float32)[:t]
    for h in halves:
        ex.combine_expert_major(y, handle, slots, w, out, hidden=hidden, half=h)
    want = np.zeros((t, hidden), np.float32)
    for k in range(topk):
        e = idx[:, k]
        on = (e >= 0).reshape(-1, 1)
        want += np.where(on, w[:, k:k + 1] * x * ((e % local) + 1).reshape(-1, 1), 0)
    assert (out == want).all(), "expert-major combine"

    # Bad input, named before anything runs: an unknown half.
    with pytest_raises_usage():
        ex.dispatch_expert_major(x, idx, recv_x, src, ranges, count, slots, handle, half="later")
    return int(count.sum())
