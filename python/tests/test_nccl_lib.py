"""The NCCL-compatible C library in the installed wheel: `python -m mscclpp_rs.nccl` names it, and
its C ABI works when loaded with ctypes (one rank on the host backend, no torchrun)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import mscclpp_rs

# ncclGetVersion's answer: NCCL_VERSION_CODE in nccl/src/abi.rs where the checkout is here.
_ABI_RS = Path(__file__).resolve().parents[2] / "nccl" / "src" / "abi.rs"


# The children run outside python/, whose source package (no extension, no library) would
# otherwise shadow the installed one for `python -m`.
_ELSEWHERE = tempfile.gettempdir()


def _expected_version() -> int:
    if _ABI_RS.is_file():
        m = re.search(r"NCCL_VERSION_CODE:\s*c_int\s*=\s*(\d+)", _ABI_RS.read_text())
        assert m, f"no NCCL_VERSION_CODE in {_ABI_RS}"
        return int(m.group(1))
    return 22803


def _cli(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "mscclpp_rs.nccl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=_ELSEWHERE,
    )
    assert r.returncode == 0, f"python -m mscclpp_rs.nccl {args}: rc {r.returncode}\n{r.stderr}"
    return r.stdout


def test_nccl_cli_path_is_the_wheels_library():
    path = _cli("--path").strip()
    assert os.path.isabs(path), path
    assert os.path.isfile(path), path
    assert os.path.basename(path) == "libmscclpp_nccl.so"
    # The installed package's copy, not one in the source tree.
    pkg = os.path.dirname(os.path.abspath(mscclpp_rs.__file__))
    assert os.path.dirname(path) == os.path.join(pkg, "lib"), (path, pkg)
    with open(path, "rb") as f:
        assert f.read(4) == b"\x7fELF"
    from mscclpp_rs.nccl import library_path

    assert library_path() == path


def test_nccl_cli_prints_the_ld_preload_line_and_the_jax_hint():
    path = _cli("--path").strip()
    out = _cli()
    lines = out.splitlines()
    assert lines[0] == path
    preload = [ln for ln in lines if ln.startswith("LD_PRELOAD=") and "torchrun" in ln]
    assert preload == [f"LD_PRELOAD={path} torchrun --nproc-per-node 8 train.py"], out
    assert "libnccl.so.2" in out and "patchelf --set-soname libnccl.so.2" in out, out
    assert f"cp {path} " in out, out


# Run in a child process: MSCCLPP_BACKEND must be set before the library first looks at it, and
# the library's threads and globals stay out of the pytest process.
_SMOKE = r"""
import ctypes, math, sys
from ctypes import POINTER, Structure, byref, c_char, c_char_p, c_float, c_int, c_size_t, c_void_p

path, want_version = sys.argv[1], int(sys.argv[2])
lib = ctypes.CDLL(path)

class UniqueId(Structure):
    _fields_ = [("internal", c_char * 128)]

lib.ncclGetErrorString.restype = c_char_p
lib.ncclGetErrorString.argtypes = [c_int]
lib.ncclGetLastError.restype = c_char_p
lib.ncclGetLastError.argtypes = [c_void_p]
lib.ncclGetVersion.argtypes = [POINTER(c_int)]
lib.ncclGetUniqueId.argtypes = [POINTER(UniqueId)]
lib.ncclCommInitRank.argtypes = [POINTER(c_void_p), c_int, UniqueId, c_int]
lib.ncclCommCount.argtypes = [c_void_p, POINTER(c_int)]
lib.ncclMemAlloc.argtypes = [POINTER(c_void_p), c_size_t]
lib.ncclMemFree.argtypes = [c_void_p]
lib.ncclAllReduce.argtypes = [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]
lib.ncclCommDestroy.argtypes = [c_void_p]

def check(name, rc, comm=None):
    if rc != 0:
        sys.exit(f"{name} returned {rc} ({lib.ncclGetErrorString(rc)!r}): "
                 f"{lib.ncclGetLastError(comm)!r}")

v = c_int(0)
check("ncclGetVersion", lib.ncclGetVersion(byref(v)))
assert v.value == want_version, f"ncclGetVersion gave {v.value}, want {want_version}"

uid = UniqueId()
check("ncclGetUniqueId", lib.ncclGetUniqueId(byref(uid)))
assert any(uid.internal), "ncclGetUniqueId left the id zero"
comm = c_void_p()
check("ncclCommInitRank", lib.ncclCommInitRank(byref(comm), 1, uid, 0))
assert comm.value, "ncclCommInitRank gave a NULL comm"
n = c_int(0)
check("ncclCommCount", lib.ncclCommCount(comm, byref(n)), comm)
assert n.value == 1, n.value

N = 4099  # not a multiple of any vector width
send, recv = c_void_p(), c_void_p()
check("ncclMemAlloc", lib.ncclMemAlloc(byref(send), 4 * N))
check("ncclMemAlloc", lib.ncclMemAlloc(byref(recv), 4 * (N + 1)))
# Host-backend device memory is this process's memory.
s = (c_float * N).from_address(send.value)
r = (c_float * (N + 1)).from_address(recv.value)
for i in range(N):
    s[i] = float(i % 97) - 48.5
for i in range(N + 1):
    r[i] = math.nan
# ncclFloat32 = 7, ncclSum = 0; NULL stream: the communicator's own (host backend)
check("ncclAllReduce", lib.ncclAllReduce(send, recv, N, 7, 0, comm, None), comm)
got = list(r[:N])
want = [float(i % 97) - 48.5 for i in range(N)]
assert got == want, f"first difference at {next(i for i in range(N) if got[i] != want[i])}"
assert math.isnan(r[N]), "ncclAllReduce wrote past the end of recvbuff"
# in place, ncclMax = 2: one rank's max is its own value
check("ncclAllReduce in place", lib.ncclAllReduce(send, send, N, 7, 2, comm, None), comm)
assert list(s) == want
check("ncclMemFree", lib.ncclMemFree(send))
check("ncclMemFree", lib.ncclMemFree(recv))
check("ncclCommDestroy", lib.ncclCommDestroy(comm))
print("ok", v.value)
"""


def test_nccl_c_abi_one_rank_all_reduce_on_host_backend():
    path = _cli("--path").strip()
    env = dict(os.environ, MSCCLPP_BACKEND="host")
    want = _expected_version()
    r = subprocess.run(
        [sys.executable, "-c", _SMOKE, path, str(want)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=_ELSEWHERE,
    )
    assert r.returncode == 0, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    assert r.stdout.split() == ["ok", str(want)], r.stdout
